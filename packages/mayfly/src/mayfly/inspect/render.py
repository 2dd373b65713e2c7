"""Renderers of a :class:`~mayfly.inspect.model.RunInspection`: a table, JSON and a Mermaid graph."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from mayfly.inspect.model import RunInspection
from mayfly.model.events import FailureCause
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.spec import EdgePredicate, OnField, OnOutcome, WorkflowSpec
from mayfly.model.state import NodeStatus, RunStatus

__all__ = ["from_json", "render_mermaid", "render_table", "to_json"]

_ENCODER = msgspec.json.Encoder()


def to_json(inspection: RunInspection) -> bytes:
    """The inspection as compact JSON (stable field order; ``schema_version`` first)."""
    return _ENCODER.encode(inspection)


def from_json(data: bytes | str) -> RunInspection:
    """Decode an inspection written by :func:`to_json`; unknown fields are rejected with their path."""
    return msgspec.json.decode(data, type=RunInspection)


_TABLE_REASON = 72  # characters of a reason shown in a table cell; JSON carries it whole


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, NodeStatus | RunStatus | NodeOutcomeKind | FailureCause):
        return str(value.value)
    return str(value)


def _one_line(text: str, limit: int = _TABLE_REASON) -> str:
    # Reasons are free text: keep each table row on one line and printable.
    flat = "".join(ch if ch.isprintable() else " " for ch in text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    out = []
    for row in (header, *rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return out


def _wall_time(ms: int) -> str:
    """Unix milliseconds as an ISO 8601 UTC time, or as a number when no calendar date holds it."""
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms after the Unix epoch"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render_table(inspection: RunInspection) -> str:
    """A human-readable, aligned rendering: run facts, nodes, attempts, blocking reasons, history."""
    ins = inspection
    b = ins.budgets
    elapsed_limit = "-" if b.elapsed_limit_ms is None else f"{b.elapsed_limit_ms} ms"
    facts = [
        ("run", ins.run_id),
        ("workflow", f"{ins.workflow_id}@{ins.workflow_version}"),
        ("spec hash", ins.spec_hash),
        ("status", ins.status.value if ins.result is None else f"{ins.status.value} (terminal)"),
        ("sequence", str(ins.sequence)),
        ("virtual now", f"{ins.now} ms (as of the last recorded fact)"),
        ("source", ins.source + "".join(f"; {_one_line(d, 200)}" for d in ins.diagnostics)),
        (
            "budgets",
            f"attempts {b.attempts_used}/{b.attempts_limit}, transitions "
            f"{b.transitions_used}/{b.transitions_limit}, elapsed {b.elapsed_ms} ms / {elapsed_limit}",
        ),
    ]
    if ins.journal_url is not None:
        facts.insert(6, ("journal", ins.journal_url))
    if ins.epoch_ms is not None:
        facts.insert(6, ("epoch", f"{_wall_time(ins.epoch_ms)} (wall clock at virtual 0 ms)"))
    if ins.parent_run_id is not None:
        facts.append(("parent", f"run {ins.parent_run_id} node {ins.parent_node_id} (depth {ins.depth})"))
    if b.exhausted is not None:
        e = b.exhausted
        where = "" if e.node_id is None else f" on {e.node_id}"
        facts.append(("exhausted", f"{e.kind}{where}: limit {e.limit}, observed {e.observed}"))
    if ins.cancellation is not None:
        c = ins.cancellation
        facts.append(
            ("cancelled", f"by {c.requester} at {c.at} ms ({c.targets} targets): {_one_line(c.reason)}")
        )
    width = max(len(k) for k, _ in facts)
    lines = [f"{k.ljust(width)}  {v}" for k, v in facts]

    lines.append("")
    lines.append(f"NODES ({len(ins.nodes)})")
    node_rows = [
        (
            n.node_id,
            n.handler,
            n.policy,
            n.status.value,
            f"{n.attempt}/{n.total_attempts}",
            "-" if n.outcome is None else n.outcome.value + (" (timeout)" if n.timeout else ""),
            _cell(n.attempt_deadline),
            _cell(n.retry_deadline),
            _one_line(n.reason) if n.reason else ("-" if n.failure is None else n.failure.value),
        )
        for n in ins.nodes
    ]
    lines += _grid(
        ("NODE", "HANDLER", "POLICY", "STATUS", "ATTEMPT", "OUTCOME", "DEADLINE", "RETRY AT", "REASON"),
        node_rows,
    )

    lines.append("")
    lines.append(f"ATTEMPTS ({len(ins.attempts)})")
    if ins.attempts:
        attempt_rows = [
            (
                a.attempt_id,
                a.node_id,
                _cell(a.attempt),
                "active" if a.outcome is None else a.outcome.value + (" (timeout)" if a.timeout else ""),
                _cell(a.started_at),
                _cell(a.finished_at),
                _one_line(a.reason) if a.reason else "-",
            )
            for a in ins.attempts
        ]
        header = ("ATTEMPT ID", "NODE", "#", "OUTCOME", "STARTED", "FINISHED", "REASON")
        lines += _grid(header, attempt_rows)

    lines.append("")
    lines.append(f"BLOCKING ({len(ins.blocking)})")
    if ins.blocking:
        width = max(len(d.node_id) for d in ins.blocking)
        lines += [f"{d.node_id.ljust(width)}  {_one_line(d.detail, 160)}" for d in ins.blocking]

    h = ins.history
    lines.append("")
    lines.append(f"HISTORY (complete {h.complete}, retained {h.retained}, omitted {h.omitted})")
    lines += list(h.lines)
    return "\n".join(lines)


_STATUS_STYLE: Final[Mapping[str, str]] = {
    "pending": "fill:#eeeeee,stroke:#9e9e9e,color:#424242",
    "ready": "fill:#e3f2fd,stroke:#42a5f5,color:#0d47a1",
    "running": "fill:#bbdefb,stroke:#1e88e5,color:#0d47a1",
    "waiting": "fill:#fff8e1,stroke:#ffb300,color:#6d4c00",
    "retry_pending": "fill:#ffe0b2,stroke:#fb8c00,color:#6d3a00",
    "changes_requested": "fill:#f3e5f5,stroke:#8e24aa,color:#4a148c",
    "succeeded": "fill:#c8e6c9,stroke:#43a047,color:#1b5e20",
    "failed": "fill:#ffcdd2,stroke:#e53935,color:#b71c1c",
    "blocked": "fill:#d7ccc8,stroke:#6d4c41,color:#3e2723",
    "cancelled": "fill:#cfd8dc,stroke:#546e7a,color:#263238",
    "skipped": "fill:#fafafa,stroke:#bdbdbd,color:#757575,stroke-dasharray:3 3",
}
_DEFAULT_STYLE = "fill:#ffffff,stroke:#000000,color:#000000"


def _mermaid_text(text: str) -> str:
    # Mermaid labels are quoted; entity-escape what would end or confuse them.
    return (
        text.replace("#", "#35;")
        .replace('"', "#quot;")
        .replace("<", "#lt;")
        .replace(">", "#gt;")
        .replace("|", "#124;")
    )


def _predicate_label(when: EdgePredicate) -> str:
    if isinstance(when, OnOutcome):
        return when.outcome.value
    if isinstance(when, OnField):
        return f"{when.field} == {msgspec.json.encode(when.equals).decode()}"
    return "any"  # OnAnyOutcome


def render_mermaid(inspection: RunInspection, spec: WorkflowSpec) -> str:
    """A Mermaid ``flowchart TD`` of ``spec``, every node coloured by its status in ``inspection``.

    ``depends_on`` edges are solid; conditional edges are dashed and labelled
    with their predicate (and exclusive group). There is one ``classDef`` per
    node status. Nodes are named ``n0, n1, ...`` in specification order
    (so ids like ``end`` cannot clash with Mermaid keywords) and labelled
    with their id and status.
    """
    if not spec.matches_hash(inspection.spec_hash):
        raise ValueError(
            f"render_mermaid: the given spec ({spec.content_hash()}) is not the one run "
            f"{inspection.run_id} pinned ({inspection.spec_hash}); pass the run's own spec"
        )
    status = {n.node_id: n.status.value for n in inspection.nodes}
    position = {node.id: i for i, node in enumerate(spec.nodes)}
    lines = ["flowchart TD"]
    for i, node in enumerate(spec.nodes):
        lines.append(f'    n{i}["{node.id}<br/>{status[node.id]}"]')
    for i, node in enumerate(spec.nodes):
        for prereq in node.depends_on:
            lines.append(f"    n{position[prereq]} --> n{i}")
    for edge in getattr(spec, "edges", ()):
        label = _predicate_label(edge.when)
        if edge.exclusive is not None:
            label += f" [{edge.exclusive}]"
        lines.append(f'    n{position[edge.source]} -. "{_mermaid_text(label)}" .-> n{position[edge.target]}')
    # Every status gets its class (statuses added later too), so the legend never depends on the run.
    names = [s.value for s in NodeStatus]
    for name in names:
        lines.append(f"    classDef {name} {_STATUS_STYLE.get(name, _DEFAULT_STYLE)}")
    members: dict[str, list[str]] = {}
    for i, node in enumerate(spec.nodes):
        members.setdefault(status[node.id], []).append(f"n{i}")
    for name in names:
        if name in members:
            lines.append(f"    class {','.join(members[name])} {name}")
    return "\n".join(lines)
