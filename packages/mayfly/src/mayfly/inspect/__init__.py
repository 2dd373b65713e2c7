"""Run inspection: a schema-versioned, payload-free view of one run (ADR-0032 Story 1.10).

:func:`build_inspection` turns a reconstructed run (:func:`mayfly.recovery.inspect_run`)
and, optionally, its journal records into a :class:`RunInspection`: ordered
node and attempt summaries, blocking diagnostics, deadlines, attempt counts,
outcome classes, budget usage, cancellation and a capped diagnostic history;
:func:`load_inspection` reads a run and builds it in one call. Three renderers
present it: :func:`render_table` (for people), :func:`to_json` (for tools) and
:func:`render_mermaid` (the graph coloured by node status). :func:`list_runs`
lists a journal's runs, filtered by state and workflow, :func:`run_status` words a
run's status as every listing and command does (``waiting`` for a running run
that only waits), and :func:`narrate`
tells each event in the one vocabulary the history lines and the CLI timeline
share.

The modules: :mod:`~mayfly.inspect.model` (the value types),
:mod:`~mayfly.inspect.build`, :mod:`~mayfly.inspect.render`,
:mod:`~mayfly.inspect.narrate`, :mod:`~mayfly.inspect.query` and
:mod:`~mayfly.inspect.status`.

What inspection never shows: run input, node input, outcome output, child
input or output, signal decisions or tokens. Those are handler data, and the
ADR keeps them out of operator views. Only outcome *kinds* and bounded
non-success reasons (at most 4 KiB each, the operator-safe diagnostic channel)
appear. Every field is copied by name from the state or an event; nothing is
serialized wholesale, so a field added to an event later cannot leak through.
"""

from mayfly.inspect.build import build_inspection, load_inspection
from mayfly.inspect.model import (
    DEFAULT_HISTORY_LIMIT,
    INSPECTION_SCHEMA_VERSION,
    AttemptSummary,
    BlockingDiagnostic,
    BudgetExhaustion,
    BudgetUsage,
    CancellationSummary,
    DiagnosticHistory,
    NodeSummary,
    RunInspection,
)
from mayfly.inspect.narrate import Narration, history_line, narrate
from mayfly.inspect.query import RUN_STATES, RunListing, list_runs
from mayfly.inspect.render import from_json, render_mermaid, render_table, to_json
from mayfly.inspect.status import WAITING, ChildStates, journal_children, run_status, wake_at_ms

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "INSPECTION_SCHEMA_VERSION",
    "RUN_STATES",
    "WAITING",
    "AttemptSummary",
    "BlockingDiagnostic",
    "BudgetExhaustion",
    "BudgetUsage",
    "CancellationSummary",
    "ChildStates",
    "DiagnosticHistory",
    "Narration",
    "NodeSummary",
    "RunInspection",
    "RunListing",
    "build_inspection",
    "from_json",
    "history_line",
    "journal_children",
    "list_runs",
    "load_inspection",
    "narrate",
    "render_mermaid",
    "render_table",
    "run_status",
    "to_json",
    "wake_at_ms",
]
