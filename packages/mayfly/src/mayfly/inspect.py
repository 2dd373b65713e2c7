"""Run inspection: a schema-versioned, payload-free view of one run (ADR-0032 Story 1.10).

:func:`build_inspection` turns a reconstructed run (:func:`mayfly.recovery.inspect_run`)
and, optionally, its journal records into a :class:`RunInspection`: ordered
node and attempt summaries, blocking diagnostics, deadlines, attempt counts,
outcome classes, budget usage, cancellation and a capped diagnostic history.
Three renderers present it: :func:`render_table` (for people),
:func:`to_json` (for tools) and :func:`render_mermaid` (the graph coloured by
node status).

What inspection never shows: run input, node input, outcome output, child
input or output, signal decisions or tokens. Those are handler data, and the
ADR keeps them out of operator views. Only outcome *kinds* and bounded
non-success reasons (at most 4 KiB each, the operator-safe diagnostic channel)
appear. Every field is copied by name from the state or an event; nothing is
serialized wholesale, so a field added to an event later cannot leak through.
"""

from __future__ import annotations

import datetime
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

from mayfly.journal import JournalRecord, redact_url
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import (
    AttemptDeadlineExpired,
    BudgetExhausted,
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    EdgeActivated,
    Event,
    FailureCause,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
    RunCreated,
    SignalAccepted,
    SignalExpired,
    SignalRejected,
    SignalWaitOpened,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import NodeOutcome, NodeOutcomeKind, RetryableFailure
from mayfly.model.spec import EdgePredicate, OnField, OnOutcome, WorkflowSpec
from mayfly.model.state import NodeState, NodeStatus, RunState, RunStatus
from mayfly.recovery import RecoveredRun
from mayfly.reducer import Upcaster, decode_event

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "INSPECTION_SCHEMA_VERSION",
    "AttemptSummary",
    "BlockingDiagnostic",
    "BudgetExhaustion",
    "BudgetUsage",
    "CancellationSummary",
    "DiagnosticHistory",
    "NodeSummary",
    "RunInspection",
    "build_inspection",
    "from_json",
    "history_line",
    "render_mermaid",
    "render_table",
    "to_json",
]

INSPECTION_SCHEMA_VERSION: Final = 1
"""Version of :class:`RunInspection` and its JSON form."""

DEFAULT_HISTORY_LIMIT: Final = 200
"""How many diagnostic history lines an inspection keeps by default (the most recent)."""

_MAX_LISTED = 5  # prerequisites or edge sources named in one blocking diagnostic


class _Frozen(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class BudgetExhaustion(_Frozen, frozen=True):
    """The budget that ran out: which, its limit, the usage observed and the last outcome before it."""

    kind: str
    limit: int
    observed: int
    node_id: str | None = None
    last_outcome_node: str | None = None
    last_outcome_kind: NodeOutcomeKind | None = None


class BudgetUsage(_Frozen, frozen=True):
    """Run budget usage against the specification's limits (``elapsed_ms`` is the run's virtual time)."""

    attempts_used: int
    attempts_limit: int
    transitions_used: int
    transitions_limit: int
    elapsed_ms: int
    elapsed_limit_ms: int | None = None
    exhausted: BudgetExhaustion | None = None


class CancellationSummary(_Frozen, frozen=True):
    """Who cancelled the run, the bounded reason, when, and how many active attempts it targeted."""

    requester: str
    reason: str
    at: int
    targets: int


class NodeSummary(_Frozen, frozen=True):
    """One node, in specification order: its status, attempts, outcome class and deadlines.

    ``attempt`` counts within the current activation, ``total_attempts`` over
    the whole run. ``reason`` is the bounded reason of a non-success outcome
    (empty for success). ``failure`` says why a node failed when its last
    outcome was not itself the failure (retries exhausted, ...), and
    ``failure_detail`` is the system's one-line explanation when the records
    were given. ``waiting_for`` names the signal a Waiting node's attempt
    waits for, and ``wait_deadline`` is when that wait expires (the token and
    any decision are never shown). Deadlines are absolute virtual milliseconds.
    """

    node_id: str
    handler: str
    policy: str
    status: NodeStatus
    attempt: int
    total_attempts: int
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    reason: str = ""
    failure: FailureCause | None = None
    failure_detail: str = ""
    attempt_deadline: int | None = None
    retry_deadline: int | None = None
    active_attempt_id: str | None = None
    child_run_id: str | None = None
    waiting_for: str | None = None
    wait_deadline: int | None = None


class AttemptSummary(_Frozen, frozen=True):
    """One consumed attempt identity: its node, outcome class (``None`` while active) and timing.

    ``reason`` is the bounded reason of a non-success outcome. ``attempt``,
    ``started_at`` and ``finished_at`` come from the journal records and are
    ``None`` when the records holding them were not given.
    """

    attempt_id: str
    node_id: str
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    reason: str = ""
    attempt: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    child_run_id: str | None = None


class BlockingDiagnostic(_Frozen, frozen=True):
    """Why a node is not progressing (or, for a non-success terminal node, why it stopped)."""

    node_id: str
    status: NodeStatus
    detail: str


class DiagnosticHistory(_Frozen, frozen=True):
    """Payload-free history lines, one per event, capped to the most recent.

    ``complete`` is the number of events in the run's history, ``retained``
    the number of lines kept here and ``omitted`` the rest
    (``complete == retained + omitted``).
    """

    lines: tuple[str, ...]
    complete: int
    retained: int
    omitted: int


class RunInspection(_Frozen, frozen=True):
    """A schema-versioned, payload-free view of one run, built by :func:`build_inspection`.

    ``result`` is the terminal result (``None`` while running), ``now`` the
    run's virtual time as of its last recorded fact and ``sequence`` the last
    event it reflects. Inspection is read-only, so ``now`` does not include
    the time since then: ``epoch_ms`` (the wall-clock time of virtual time 0,
    ``None`` for runs recorded before epochs) tells how much has passed, and
    the next resume first advances the run to it.
    ``source`` says whether the state came from a snapshot plus the journal
    tail or from the whole journal, with ``diagnostics`` explaining any
    snapshot that was discarded. ``journal_url`` has its password redacted.
    """

    schema_version: int
    run_id: str
    workflow_id: str
    workflow_version: int
    spec_hash: str
    status: RunStatus
    result: str | None
    now: int
    sequence: int
    source: Literal["snapshot", "journal"]
    budgets: BudgetUsage
    nodes: tuple[NodeSummary, ...]
    attempts: tuple[AttemptSummary, ...]
    blocking: tuple[BlockingDiagnostic, ...]
    history: DiagnosticHistory
    diagnostics: tuple[str, ...] = ()
    journal_url: str | None = None
    cancellation: CancellationSummary | None = None
    parent_run_id: str | None = None
    parent_node_id: str | None = None
    depth: int = 0
    epoch_ms: int | None = None


# -- building ------------------------------------------------------------------------


class _Timing:
    """What the records say about attempts, and their diagnostic lines."""

    __slots__ = ("attempt_numbers", "failure_details", "finished", "lines", "started", "wait_opened")

    def __init__(self, limit: int) -> None:
        self.started: dict[str, int] = {}
        self.wait_opened: dict[str, int] = {}
        self.finished: dict[str, int] = {}
        self.attempt_numbers: dict[str, int] = {}
        self.failure_details: dict[str, str] = {}
        self.lines: deque[str] = deque(maxlen=limit)


def _scan(
    state: RunState,
    records: Sequence[JournalRecord],
    limit: int,
    upcasters: Mapping[tuple[str, int], Upcaster] | None,
) -> _Timing:
    timing = _Timing(limit)
    previous = 0
    for record in records:
        if record.run_id != state.run_id:
            raise InvalidRecord(
                f"inspection of run {state.run_id} was given a record of run {record.run_id} "
                f"(sequence {record.sequence}); pass only this run's records"
            )
        if record.sequence <= previous or record.sequence > state.sequence:
            raise InvalidRecord(
                f"inspection of run {state.run_id} was given sequence {record.sequence} after "
                f"{previous} (state is at {state.sequence}); pass records in order, up to the state"
            )
        previous = record.sequence
        event = decode_event(record.event_type, record.schema_version, record.payload, upcasters=upcasters)
        if isinstance(event, NodeStarted | ChildStarted):
            timing.started[event.attempt_id] = event.at
            timing.attempt_numbers[event.attempt_id] = event.attempt
        elif isinstance(event, NodeOutcomeCommitted):
            if event.attempt_id is not None:
                timing.finished[event.attempt_id] = event.at
            timing.failure_details.pop(event.node_id, None)
        elif isinstance(event, NodeFailed):
            timing.failure_details[event.node_id] = event.detail
        elif isinstance(event, SignalWaitOpened):
            timing.wait_opened[event.attempt_id] = event.at
        timing.lines.append(f"#{record.sequence} {history_line(event)}")
    return timing


def history_line(event: Event) -> str:
    """One payload-free line describing ``event`` (without its sequence), e.g. ``NodeReady plan initial``."""
    name = type(event).__name__
    detail: str
    if isinstance(event, RunCreated):
        detail = f"{event.spec.workflow_id}@{event.spec.version} nodes={len(event.spec.nodes)}"
    elif isinstance(event, NodeReady):
        detail = f"{event.node_id} {event.cause}"
    elif isinstance(event, NodeStarted):
        detail = f"{event.node_id} attempt {event.attempt} at {event.at}"
    elif isinstance(event, NodeOutcomeCommitted):
        detail = f"{event.node_id} {_kind_text(event.outcome)}"
        if event.attempt_id is None:
            detail += " (assigned)"
    elif isinstance(event, NodeFailed):
        detail = f"{event.node_id} {event.cause.value}"
    elif isinstance(event, RetryScheduled):
        detail = f"{event.node_id} attempt {event.next_attempt} at {event.deadline}"
    elif isinstance(event, RetryReleased):
        detail = f"{event.node_id} attempt {event.next_attempt} at {event.at}"
    elif isinstance(event, EdgeActivated):
        detail = f"{event.source} -> {event.target} (edge {event.edge})"
    elif isinstance(event, ChildStarted):
        detail = f"{event.node_id} attempt {event.attempt} child {event.workflow_id}@{event.version}"
    elif isinstance(event, ChildCompleted):
        detail = f"{event.node_id} child {event.result}"
    elif isinstance(event, VirtualTimeAdvanced):
        detail = f"to {event.to}"
    elif isinstance(event, AttemptDeadlineExpired):
        detail = f"{event.node_id} deadline {event.deadline}"
    elif isinstance(event, BudgetExhausted):
        detail = f"{event.kind.value} limit {event.limit} observed {event.observed}"
    elif isinstance(event, CancellationRequested):
        detail = f"by {event.requester} targets={len(event.targets)}"
    elif isinstance(event, RunCompleted):
        detail = event.result
    elif isinstance(event, SignalWaitOpened):
        until = "no deadline" if event.deadline is None else f"until {event.deadline}"
        detail = f"{event.node_id} signal {event.name} {until}"
    elif isinstance(event, SignalAccepted):
        detail = f"{event.node_id} signal {event.name}"  # never the decision: it is handler data
    elif isinstance(event, SignalRejected):
        detail = f"{event.node_id} {event.reason.value}"
    elif isinstance(event, SignalExpired):
        detail = f"{event.node_id} signal {event.name} deadline {event.deadline}"
    else:
        # Unreachable while every event type has a branch above. A new type lands here at run time
        # (named, payload-free) and makes this ignore unused, so mypy asks for its own branch.
        node_id = getattr(event, "node_id", None)  # type: ignore[unreachable]
        detail = node_id if isinstance(node_id, str) else ""
    return f"{name} {detail}".rstrip()


def _kind_text(outcome: NodeOutcome) -> str:
    if isinstance(outcome, RetryableFailure) and outcome.timeout:
        return f"{outcome.kind.value} timeout"
    return outcome.kind.value


def _reason(outcome: NodeOutcome | None) -> str:
    if outcome is None:
        return ""
    reason = getattr(outcome, "reason", "")
    return reason if isinstance(reason, str) else ""


def _handler_text(node: NodeState) -> str:
    spec = node.spec
    if spec.handler is not None:
        return spec.handler
    if spec.child is not None:
        return f"child {spec.child.workflow_id}@{spec.child.version}"
    return "-"


def _summarize_node(node: NodeState, timing: _Timing | None) -> NodeSummary:
    outcome = node.last_outcome
    return NodeSummary(
        node_id=node.node_id,
        handler=_handler_text(node),
        policy=node.spec.policy,
        status=node.status,
        attempt=node.attempt,
        total_attempts=node.total_attempts,
        outcome=None if outcome is None else outcome.kind,
        timeout=isinstance(outcome, RetryableFailure) and outcome.timeout,
        reason=_reason(outcome),
        failure=node.failure if node.status is NodeStatus.FAILED else None,
        failure_detail=(
            timing.failure_details.get(node.node_id, "")
            if timing is not None and node.status is NodeStatus.FAILED
            else ""
        ),
        attempt_deadline=node.attempt_deadline,
        retry_deadline=node.retry_deadline,
        active_attempt_id=node.attempt_id,
        child_run_id=node.child_run_id,
        waiting_for=None if node.wait is None else node.wait.name,
        wait_deadline=None if node.wait is None else node.wait.deadline,
    )


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown if len(items) <= _MAX_LISTED else f"{shown} and {len(items) - _MAX_LISTED} more"


def _blocking(
    state: RunState, node: NodeState, edge_sources: Mapping[str, list[str]], timing: _Timing | None
) -> str | None:
    status = node.status
    outcome = node.last_outcome
    reason = _reason(outcome)
    if status is NodeStatus.SUCCEEDED:
        return None
    if status.is_terminal:
        kind = "no outcome" if outcome is None else _kind_text(outcome)
        text = status.value if kind == status.value else f"{status.value}: {kind}"
        if status is NodeStatus.FAILED and node.failure is not None:
            text += f" ({node.failure.value})"
        return f"{text}: {reason}" if reason else text
    if status is NodeStatus.PENDING:
        if node.spec.depends_on:
            waiting = []
            for prereq in node.spec.depends_on:
                other = state.node_by_id(prereq)
                if other is not None and not other.status.is_terminal:
                    waiting.append(f"{prereq} ({other.status.value})")
            if waiting:
                return f"pending on prerequisites ({node.spec.policy}): {_names(waiting)}"
            return f"pending; prerequisites are settled ({node.spec.policy})"
        sources = edge_sources.get(node.node_id)
        if sources:
            return f"pending until a conditional edge from {_names(sources)} fires"
        return "pending; not yet released"
    if status is NodeStatus.READY:
        return f"ready for attempt {node.attempt + 1}; waiting to be dispatched"
    if status is NodeStatus.RETRY_PENDING:
        deadline = node.retry_deadline
        if deadline is None:
            return f"waiting to retry (attempt {node.attempt + 1})"
        due = "due now" if deadline <= state.now else f"in {deadline - state.now} ms"
        return f"waiting for retry attempt {node.attempt + 1} at {deadline} ({due})"
    if status is NodeStatus.CHANGES_REQUESTED:
        text = "changes requested; waiting for a correction edge to re-activate the work"
        return f"{text}: {reason}" if reason else text
    # RUNNING, WAITING and any status added later: describe the active attempt.
    wait = node.wait
    text = status.value if wait is None else f"waiting for signal {wait.name} on"
    if node.attempt_id is not None:
        text += f" attempt {node.attempt} ({node.attempt_id})"
        times = None if timing is None else timing.wait_opened if wait is not None else timing.started
        since = None if times is None else times.get(node.attempt_id)
        if since is not None:
            text += f" since {since}"
    if wait is not None:
        if wait.deadline is None:
            text += ", no deadline"
        else:
            due = "due now" if wait.deadline <= state.now else f"in {wait.deadline - state.now} ms"
            text += f", expires at {wait.deadline} ({due})"
    if node.child_run_id is not None:
        text += f", child run {node.child_run_id}"
    if node.attempt_deadline is not None:
        text += f", deadline {node.attempt_deadline}"
    return text


def build_inspection(
    recovered: RecoveredRun,
    records: Sequence[JournalRecord] | None = None,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
    *,
    journal_url: str | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> RunInspection:
    """Build the payload-free inspection of a reconstructed run.

    ``records`` are the run's journal records, in order and up to the
    state's sequence; they may be the whole history or only its tail (the
    last ``history_limit`` are enough for the history lines). Without them
    the history is empty (all lines omitted) and attempt timings are
    unknown. A record of another run, or out of order, raises
    :class:`~mayfly.model.errors.InvalidRecord`.
    """
    if isinstance(history_limit, bool) or not isinstance(history_limit, int) or history_limit < 0:
        raise ValueError(f"history_limit must be an int >= 0, got {history_limit!r}")
    state = recovered.state
    timing = None if records is None else _scan(state, records, history_limit, upcasters)
    edge_sources: dict[str, list[str]] = {}
    for edge in state.spec.edges:
        sources = edge_sources.setdefault(edge.target, [])
        if edge.source not in sources:
            sources.append(edge.source)
    nodes = tuple(_summarize_node(node, timing) for node in state.nodes)
    blocking = []
    for node in state.nodes:
        detail = _blocking(state, node, edge_sources, timing)
        if detail is not None:
            blocking.append(BlockingDiagnostic(node.node_id, node.status, detail))
    attempts = tuple(
        AttemptSummary(
            attempt_id=a.attempt_id,
            node_id=a.node_id,
            outcome=None if a.outcome is None else a.outcome.kind,
            timeout=isinstance(a.outcome, RetryableFailure) and a.outcome.timeout,
            reason=_reason(a.outcome),
            attempt=None if timing is None else timing.attempt_numbers.get(a.attempt_id),
            started_at=None if timing is None else timing.started.get(a.attempt_id),
            finished_at=None if timing is None else timing.finished.get(a.attempt_id),
            child_run_id=a.child_run_id,
        )
        for a in state.to_record().attempts
    )
    lines = () if timing is None else tuple(timing.lines)
    budgets = state.spec.budgets
    exhausted = state.exhausted
    cancellation = state.cancellation
    return RunInspection(
        schema_version=INSPECTION_SCHEMA_VERSION,
        run_id=state.run_id,
        workflow_id=state.spec.workflow_id,
        workflow_version=state.spec.version,
        spec_hash=state.spec_hash,
        status=state.status,
        result=state.status.value if state.status.is_terminal else None,
        now=state.now,
        sequence=state.sequence,
        source=recovered.source,
        diagnostics=tuple(recovered.diagnostics),
        journal_url=None if journal_url is None else redact_url(journal_url),
        budgets=BudgetUsage(
            attempts_used=state.attempts_used,
            attempts_limit=budgets.max_attempts,
            transitions_used=state.transitions_used,
            transitions_limit=budgets.max_transitions,
            elapsed_ms=state.now,
            elapsed_limit_ms=budgets.max_elapsed_ms,
            exhausted=None
            if exhausted is None
            else BudgetExhaustion(
                kind=exhausted.kind.value,
                limit=exhausted.limit,
                observed=exhausted.observed,
                node_id=exhausted.node_id,
                last_outcome_node=None if exhausted.last_outcome is None else exhausted.last_outcome.node_id,
                last_outcome_kind=None if exhausted.last_outcome is None else exhausted.last_outcome.kind,
            ),
        ),
        cancellation=None
        if cancellation is None
        else CancellationSummary(
            requester=cancellation.requester,
            reason=cancellation.reason,
            at=cancellation.at,
            targets=len(cancellation.targets),
        ),
        nodes=nodes,
        attempts=attempts,
        blocking=tuple(blocking),
        history=DiagnosticHistory(
            lines=lines,
            complete=state.sequence,
            retained=len(lines),
            omitted=state.sequence - len(lines),
        ),
        parent_run_id=None if state.parent is None else state.parent.run_id,
        parent_node_id=None if state.parent is None else state.parent.node_id,
        depth=state.depth,
        epoch_ms=state.epoch_ms,
    )


# -- renderers -----------------------------------------------------------------------

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
