"""Acme's Mayfly plugin: a specification policy and an upcaster for ``NodeReady`` v1 histories.

- ``mayfly_validate_spec`` refuses any node whose handler is in the ``unsafe.``
  namespace, naming the node and the policy.
- ``mayfly_event_upcasters`` lifts ``NodeReady`` v1 bodies, which named the
  node ``node``, to v2, which names it ``node_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mayfly.errors import ValidationIssue
from mayfly.hookspecs import hookimpl

MAYFLY_PLUGIN_API = 1

POLICY = "acme policy: handlers in the unsafe. namespace are not allowed"


@hookimpl
def mayfly_validate_spec(spec: Any) -> Sequence[ValidationIssue]:
    """One issue per node whose handler is in the ``unsafe.`` namespace."""
    return [
        ValidationIssue(f"nodes[{node.id}].handler", f"{POLICY} ({node.handler})")
        for node in spec.nodes
        if node.handler is not None and node.handler.startswith("unsafe.")
    ]


def node_ready_v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    """``NodeReady`` v1 -> v2: the field ``node`` was renamed ``node_id``."""
    lifted = dict(body)
    lifted["node_id"] = lifted.pop("node")
    return lifted


@hookimpl
def mayfly_event_upcasters() -> Mapping[tuple[str, int], Callable[[Any], Any]]:
    """Acme's upcasters, keyed by ``(event_type, from_version)``."""
    return {("NodeReady", 1): node_ready_v1_to_v2}
