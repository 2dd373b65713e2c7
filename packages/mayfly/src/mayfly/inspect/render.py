"""Renderers of a :class:`~mayfly.inspect.model.RunInspection`: a table, JSON and a Mermaid graph."""

from __future__ import annotations

import datetime
import re
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


def wall_time(ms: int) -> str:
    """Unix milliseconds as an ISO 8601 UTC time, or as a number when no calendar date holds it."""
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms after the Unix epoch"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: int) -> str:
    """A span of milliseconds in the largest units that read well: ``450 ms``, ``12s``, ``3h 5m``, ``7d``."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def _relative(delta_ms: int) -> str:
    if delta_ms == 0:
        return "now"
    return f"in {duration(delta_ms)}" if delta_ms > 0 else f"{duration(delta_ms)} ago"


class _Clock:
    """Virtual milliseconds told as wall times and durations, when the run's epoch is known.

    Durations count from ``wall_ms`` (the reader's present) when given, else from the run's
    virtual now (the last recorded fact).
    """

    def __init__(self, ins: RunInspection, wall_ms: int | None) -> None:
        self.epoch = ins.epoch_ms
        if wall_ms is not None and self.epoch is not None:
            self.present = wall_ms - self.epoch  # the present, in the run's virtual milliseconds
        else:
            self.present = ins.now

    def wall(self, ms: int) -> str:
        if self.epoch is None:
            return ""
        return wall_time(self.epoch + ms)

    def when(self, ms: int | None, *, relative: bool = True) -> str:
        """``604800459 ms (2026-12-08T13:21:15.908Z, in 7d)``; a bare ``-`` for no time."""
        if ms is None:
            return "-"
        told = [self.wall(ms)] if self.epoch is not None else []
        if relative:
            told.append(_relative(ms - self.present))
        return f"{ms} ms ({', '.join(told)})" if told else f"{ms} ms"

    def due(self, ms: int | None) -> str:
        """A deadline cell: ``604800424 ms, in 7d`` (how far it is from the present), or ``-``."""
        return "-" if ms is None else f"{ms} ms, {_relative(ms - self.present)}"

    def short(self, ms: int | None) -> str:
        """A table cell: ``448 ms 13:21:15Z`` (the wall time of day), or ``-``."""
        if ms is None:
            return "-"
        if self.epoch is None:
            return f"{ms} ms"
        wall = self.wall(ms)
        return f"{ms} ms {wall[11:19]}Z" if "T" in wall else f"{ms} ms"

    def detail(self, text: str, now: int) -> str:
        """A blocking detail with its virtual times told: ``at 500 (in 300 ms)`` gains a wall time.

        ``now`` is the virtual time the detail's ``in N ms`` counts from (the last recorded fact).
        """

        def relative(in_ms: str) -> str:
            return _relative(int(in_ms) + now - self.present)

        def at(match: re.Match[str]) -> str:
            ms = int(match.group(2))
            told = [w for w in (self.wall(ms),) if w]
            if match.group(3) is not None:
                told.append(relative(match.group(3)))
            return f"{match.group(1)} {ms} ms" + (f" ({', '.join(told)})" if told else "")

        text = _AT_MS.sub(at, text)
        return _IN_MS.sub(lambda m: f"({relative(m.group(1))})", text)


_IN_MS = re.compile(r"\(in (\d+) ms\)")
_AT_MS = re.compile(r"\b(at|since|deadline) (\d+)(?: \(in (\d+) ms\))?(?![\d ]*ms)")


def _status_text(ins: RunInspection) -> str:
    if ins.result is not None:
        return f"{ins.status} (terminal)"
    if ins.status != "waiting":
        return ins.status
    waits = [f"{n.node_id} (signal {n.waiting_for})" for n in ins.nodes if n.waiting_for is not None]
    waits += [f"{n.node_id} (retry)" for n in ins.nodes if n.retry_deadline is not None]
    waits += [f"{n.node_id} (child run)" for n in ins.nodes if n.child_run_id and n.active_attempt_id]
    on = f": {', '.join(waits)}" if waits else ""
    return f"waiting (a running run that only waits{on}; see BLOCKING)"


def render_table(inspection: RunInspection, *, wall_ms: int | None = None) -> str:
    """A human-readable, aligned rendering: run facts, nodes, attempts, blocking reasons, history.

    Virtual milliseconds are shown with their wall-clock time when the run's
    epoch is known, and deadlines with how far away they are: from
    ``wall_ms`` (the present, Unix milliseconds; what ``mayfly inspect``
    passes) when given, else from the run's last recorded fact.
    """
    ins = inspection
    clock = _Clock(ins, wall_ms)
    b = ins.budgets
    elapsed_limit = "-" if b.elapsed_limit_ms is None else duration(b.elapsed_limit_ms)
    facts = [
        ("run", ins.run_id),
        ("workflow", f"{ins.workflow_id}@{ins.workflow_version}"),
        ("spec hash", ins.spec_hash),
        ("status", _status_text(ins)),
        ("sequence", f"{ins.sequence} (events in the history)"),
        ("virtual now", f"{ins.now} ms (as of the last recorded fact)"),
        ("source", ins.source + "".join(f"; {_one_line(d, 200)}" for d in ins.diagnostics)),
        (
            "budgets",
            f"attempts {b.attempts_used}/{b.attempts_limit}, transitions "
            f"{b.transitions_used}/{b.transitions_limit}, elapsed {duration(b.elapsed_ms)} / {elapsed_limit}",
        ),
    ]
    if ins.journal_url is not None:
        facts.insert(6, ("journal", ins.journal_url))
    if ins.epoch_ms is not None:
        facts.insert(6, ("epoch", f"{wall_time(ins.epoch_ms)} (wall clock at virtual 0 ms)"))
        if wall_ms is not None:
            last = ins.epoch_ms + ins.now
            facts.insert(6, ("last fact", f"{wall_time(last)} ({_relative(last - wall_ms)})"))
    if ins.parent_run_id is not None:
        facts.append(("parent", f"run {ins.parent_run_id} node {ins.parent_node_id} (depth {ins.depth})"))
    if b.exhausted is not None:
        e = b.exhausted
        where = "" if e.node_id is None else f" on {e.node_id}"
        facts.append(("exhausted", f"{e.kind}{where}: limit {e.limit}, observed {e.observed}"))
    if ins.cancellation is not None:
        c = ins.cancellation
        facts.append(
            (
                "cancelled",
                f"by {c.requester} at {clock.when(c.at, relative=False)} ({c.targets} targets): "
                f"{_one_line(c.reason)}",
            )
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
            clock.due(n.attempt_deadline if n.wait_deadline is None else n.wait_deadline),
            clock.due(n.retry_deadline),
            _one_line(n.reason) if n.reason else ("-" if n.failure is None else n.failure.value),
        )
        for n in ins.nodes
    ]
    lines += _grid(
        ("NODE", "HANDLER", "POLICY", "STATUS", "ATTEMPT", "OUTCOME", "DEADLINE", "RETRY AT", "REASON"),
        node_rows,
    )
    lines.append(
        "  ATTEMPT: this activation's attempt / attempts over the whole run. DEADLINE: of the "
        "attempt or its signal wait. Times are the run's virtual ms"
        + (" (STARTED, FINISHED: with the UTC time of day)" if ins.epoch_ms is not None else "")
        + "."
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
                clock.short(a.started_at),
                clock.short(a.finished_at),
                _one_line(a.reason) if a.reason else "-",
            )
            for a in ins.attempts
        ]
        header = ("ATTEMPT ID", "NODE", "ATTEMPT", "OUTCOME", "STARTED", "FINISHED", "REASON")
        lines += _grid(header, attempt_rows)
        lines.append(
            "  ATTEMPT: the attempt's number within its node's activation (- when its start "
            "record was not read)."
        )

    lines.append("")
    lines.append(f"BLOCKING ({len(ins.blocking)})")
    if ins.blocking:
        lines += _grid(
            ("NODE", "WHY IT IS NOT DONE"),
            [(d.node_id, _one_line(clock.detail(d.detail, ins.now), 200)) for d in ins.blocking],
        )

    h = ins.history
    lines.append("")
    lines.append(f"HISTORY (complete {h.complete}, retained {h.retained}, omitted {h.omitted})")
    if h.omitted:
        lines.append(f"  the first {h.omitted} events are left out; `--history N` keeps more")
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
