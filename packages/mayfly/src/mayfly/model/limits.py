"""Bounds on everything that enters durable history (ADR-0032, Story 1.3 and Story 1.4)."""

from __future__ import annotations

__all__ = [
    "MAX_CHILD_DEPTH",
    "MAX_EVIDENCE_REFS",
    "MAX_HANDLER_NAME",
    "MAX_INLINE_INPUT_BYTES",
    "MAX_INLINE_OUTPUT_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "MAX_NODES",
    "MAX_REASON_BYTES",
]

MAX_INLINE_OUTPUT_BYTES = 64 * 1024
"""Inline outcome output, as compact JSON."""

MAX_INLINE_INPUT_BYTES = 64 * 1024
"""Inline node or run input, as compact JSON; larger input travels as artifact references."""

MAX_JSON_DEPTH = 128
"""Nesting levels of arrays and objects in an inline input or signal decision.

Decoders recurse once per level, and Python's recursion limit sits near 1,000
frames, shared with whatever is on the stack; a bound far below it means a
value accepted today decodes in every later replay, from any caller.
"""

MAX_JSON_INT_DIGITS = 4_300
"""Decimal digits of an integer in an inline input or signal decision (msgspec reads no longer ones)."""

MAX_REASON_BYTES = 4 * 1024
"""A non-success reason, as UTF-8."""

MAX_EVIDENCE_REFS = 32
"""Artifact references one outcome may carry."""

MAX_HANDLER_NAME = 128
"""Characters in a handler name."""

MAX_NODES = 1_000_000
"""Nodes in one specification; a guard against accidental explosions, far above real graphs."""

MAX_CHILD_DEPTH = 8
"""Nesting levels of child workflows below the root."""
