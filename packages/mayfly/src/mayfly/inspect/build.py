"""Building a :class:`~mayfly.inspect.model.RunInspection` from a reconstructed run and its records."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

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
from mayfly.inspect.narrate import history_line
from mayfly.inspect.status import ChildStates, journal_children, run_status
from mayfly.journal import JournalRecord, WorkflowJournal, redact_url
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import ChildStarted, NodeFailed, NodeOutcomeCommitted, NodeStarted, SignalWaitOpened
from mayfly.model.outcomes import NodeOutcome, RetryableFailure
from mayfly.model.state import NodeState, NodeStatus, RunState
from mayfly.plugins import PluginManager, plugin_manager
from mayfly.recovery import RecoveredRun, inspect_run
from mayfly.reducer import Upcaster, decode_event

__all__ = ["build_inspection", "load_inspection"]

_MAX_LISTED = 5  # prerequisites or edge sources named in one blocking diagnostic


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


def _check_history_limit(history_limit: object) -> None:
    if isinstance(history_limit, bool) or not isinstance(history_limit, int) or history_limit < 0:
        raise ValueError(f"history_limit must be an int >= 0, got {history_limit!r}")


def build_inspection(
    recovered: RecoveredRun,
    records: Sequence[JournalRecord] | None = None,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
    *,
    journal_url: str | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    children: ChildStates | None = None,
) -> RunInspection:
    """Build the payload-free inspection of a reconstructed run.

    ``records`` are the run's journal records, in order and up to the
    state's sequence; they may be the whole history or only its tail (the
    last ``history_limit`` are enough for the history lines). Without them
    the history is empty (all lines omitted) and attempt timings are
    unknown. A record of another run, or out of order, raises
    :class:`~mayfly.model.errors.InvalidRecord`.
    ``upcasters`` lift older event versions as the records are decoded; left
    out, they are those of the process's plugin manager
    (:func:`mayfly.plugins.plugin_manager`), and ``{}`` means none.
    ``children`` reads child runs, so that a run whose attempts in flight
    call child runs that wait is ``waiting`` (:func:`~mayfly.inspect.run_status`;
    :func:`~mayfly.inspect.journal_children` reads them from a journal).
    """
    _check_history_limit(history_limit)
    state = recovered.state
    timing = None
    if records is not None:
        upcasters = plugin_manager().event_upcasters() if upcasters is None else upcasters
        timing = _scan(state, records, history_limit, upcasters)
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
        status=run_status(state, children),
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


def load_inspection(
    journal: WorkflowJournal | str,
    run_id: str,
    history_limit: int = DEFAULT_HISTORY_LIMIT,
    *,
    plugins: PluginManager | None = None,
) -> RunInspection:
    """Read run ``run_id`` and build its inspection, with the last ``history_limit`` history lines.

    ``journal`` is a journal or its URL (opened through ``plugins``).
    ``plugins`` is the plugin context whose event upcasters read the history,
    by default the process's entry-point manager; this is what
    ``mayfly inspect RUN`` prints.
    """
    _check_history_limit(history_limit)
    plugins = plugin_manager() if plugins is None else plugins
    if isinstance(journal, str):
        journal = plugins.open_journal(journal)
    upcasters = plugins.event_upcasters()
    recovered = inspect_run(journal, run_id, upcasters=upcasters)
    records = journal.read(run_id, after=max(recovered.state.sequence - history_limit, 0))
    return build_inspection(
        recovered,
        records,
        history_limit,
        journal_url=journal.url,
        upcasters=upcasters,
        children=journal_children(journal, upcasters),
    )
