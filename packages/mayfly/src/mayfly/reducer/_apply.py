"""Applying one event to a state: the single definition of what every fact means.

``reduce`` applies events to the real :class:`RunState`; ``decide`` applies
the events it proposes to a :class:`~mayfly.reducer._draft.Draft`. Both are a
:class:`RunView`, and the rules below are written once against it.

Every check here is a corruption check: history that contradicts itself fails
closed with :class:`CorruptionError` naming the sequence and event.

Every node status change goes through ``_set_status``, which keeps the run's
counters exact in both directions: a conditional edge may re-activate a node
that already reached a terminal status, so the terminal counters, the
dependents' prerequisite counters, ``open_nodes``, ``n_idle`` (open nodes
that wait for something else) and the parked index are decremented as exactly
as they were incremented.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from mayfly.model.errors import CorruptionError
from mayfly.model.events import (
    AttemptDeadlineExpired,
    BudgetExhausted,
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    EdgeActivated,
    Event,
    LastOutcome,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    ParentLink,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
    RunCreated,
    RunResult,
    SignalAccepted,
    SignalExpired,
    SignalRejected,
    SignalWaitOpened,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import NodeOutcome, NodeOutcomeKind
from mayfly.model.signals import AcceptedSignal, ConsumedSignal, SignalWait
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import (
    AttemptRecord,
    NodeDetail,
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    count_terminal,
    is_parked,
    uncount_terminal,
)

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_BLOCKED = NodeStatus.BLOCKED
_CANCELLED = NodeStatus.CANCELLED
_CHANGES_REQUESTED = NodeStatus.CHANGES_REQUESTED
_FAILED = NodeStatus.FAILED
_KIND_BLOCKED = NodeOutcomeKind.BLOCKED
_KIND_CANCELLED = NodeOutcomeKind.CANCELLED
_KIND_CHANGES_REQUESTED = NodeOutcomeKind.CHANGES_REQUESTED
_KIND_PERMANENT_FAILURE = NodeOutcomeKind.PERMANENT_FAILURE
_KIND_RETRYABLE_FAILURE = NodeOutcomeKind.RETRYABLE_FAILURE
_KIND_SKIPPED = NodeOutcomeKind.SKIPPED
_KIND_SUCCEEDED = NodeOutcomeKind.SUCCEEDED
_PENDING = NodeStatus.PENDING
_READY = NodeStatus.READY
_RETRY_PENDING = NodeStatus.RETRY_PENDING
_RUNNING = NodeStatus.RUNNING
_RUN_BLOCKED = RunStatus.BLOCKED
_RUN_CANCELLED = RunStatus.CANCELLED
_RUN_FAILED = RunStatus.FAILED
_RUN_RUNNING = RunStatus.RUNNING
_RUN_SUCCEEDED = RunStatus.SUCCEEDED
_SKIPPED = NodeStatus.SKIPPED
_SUCCEEDED = NodeStatus.SUCCEEDED
_WAITING = NodeStatus.WAITING


__all__ = ["RunView", "apply_event", "can_activate", "is_retry_class", "new_state", "run_result"]


class RunView(Protocol):
    """What applying an event reads and writes; implemented by RunState and Draft."""

    run_id: str
    spec: WorkflowSpec
    parent: ParentLink | None
    index: dict[str, int]
    status: RunStatus
    sequence: int
    now: int
    attempts_used: int
    transitions_used: int
    open_nodes: int
    n_failed: int
    n_blocked: int
    n_cancelled: int
    n_idle: int
    last_outcome: LastOutcome | None
    exhausted: BudgetExhausted | None
    cancellation: CancellationRequested | None

    def node(self, index: int) -> NodeState: ...
    def node_mut(self, index: int) -> NodeState: ...
    def attempt(self, attempt_id: str) -> AttemptRecord | None: ...
    def record_attempt(self, record: AttemptRecord, index: int) -> None: ...
    def close_attempt(self, attempt_id: str, outcome: NodeOutcome) -> None: ...
    def set_ready(self, index: int, ready: bool) -> None: ...
    def set_waiting(self, index: int, waiting: bool) -> None: ...
    def set_retry(self, index: int, deadline: int | None) -> None: ...
    def active_attempts(self) -> Iterator[tuple[str, int]]: ...
    def pending_retries(self) -> Iterator[tuple[int, int]]: ...
    def set_parked(self, index: int, parked: bool) -> None: ...
    def parked_nodes(self) -> list[int]: ...
    def edge_fired(self, edge: int) -> int: ...
    def set_edge_fired(self, edge: int, source_sequence: int) -> None: ...
    def child_attempt(self, child_run_id: str) -> str | None: ...
    def consumed_signal(self, signal_id: str) -> ConsumedSignal | None: ...
    def consume_signal(self, record: ConsumedSignal) -> None: ...


def new_state(event: RunCreated) -> RunState:
    """The state of a run right after ``event`` (its first event, sequence 1)."""
    state = RunState(
        event.run_id,
        event.spec,
        event.spec_hash,
        event.input,
        event.parent,
        epoch_ms=event.epoch_ms,
        queue=event.queue,
        priority=event.priority,
        dedup_id=event.dedup_id,
    )
    state.sequence = 1
    return state


def is_retry_class(node: NodeState, kind: NodeOutcomeKind) -> bool:
    """Whether an outcome of ``kind`` leaves ``node`` pending a retry decision.

    RetryableFailure always does (the decision may still be an explicit
    NodeFailed); PermanentFailure only when the policy names it. This is static
    spec data, so decide and reduce agree without sharing dynamic policy.
    """
    if kind is _KIND_RETRYABLE_FAILURE:
        return True
    return kind is _KIND_PERMANENT_FAILURE and kind in node.spec.retry.retry_on


def run_result(run: RunView) -> RunResult:
    """The terminal result once every node is terminal: failure > blocked > cancelled > success."""
    if run.exhausted is not None:
        return "failed"
    if run.cancellation is not None:
        return "cancelled"
    if run.n_failed:
        return "failed"
    if run.n_blocked:
        return "blocked"
    if run.n_cancelled:
        return "cancelled"
    return "succeeded"


_OUTCOME_STATUS = {
    _KIND_SUCCEEDED: _SUCCEEDED,
    _KIND_PERMANENT_FAILURE: _FAILED,
    _KIND_BLOCKED: _BLOCKED,
    _KIND_CANCELLED: _CANCELLED,
    _KIND_SKIPPED: _SKIPPED,
    _KIND_RETRYABLE_FAILURE: _RETRY_PENDING,
    _KIND_CHANGES_REQUESTED: _CHANGES_REQUESTED,
}

_RESULT_STATUS: dict[str, RunStatus] = {
    "succeeded": _RUN_SUCCEEDED,
    "failed": _RUN_FAILED,
    "blocked": _RUN_BLOCKED,
    "cancelled": _RUN_CANCELLED,
}


def _corrupt(seq: int, event: Event, problem: str) -> CorruptionError:
    return CorruptionError(f"history is inconsistent at sequence {seq} ({type(event).__name__}): {problem}")


def _node(run: RunView, seq: int, event: Event, node_id: str) -> NodeState:
    i = run.index.get(node_id)
    if i is None:
        raise _corrupt(seq, event, f"unknown node {node_id!r}")
    return run.node_mut(i)


# Hashing an Enum member is a Python-level call; sets of member ids keep this hot path in C.
_TERMINAL = frozenset(id(status) for status in NodeStatus if status.is_terminal)
_IDLE = frozenset(id(status) for status in NodeStatus if status.is_idle)


def _set_status(run: RunView, node: NodeState, status: NodeStatus) -> None:
    """Move ``node`` to ``status``, keeping every run counter and index exact (both directions)."""
    old = node.status
    if old is status:
        return
    if id(old) in _TERMINAL:
        uncount_terminal(run, node)
        run.open_nodes += 1
    if old is _READY:
        run.set_ready(node.index, False)
    elif old is _WAITING:
        run.set_waiting(node.index, False)
    was_idle = id(old) in _IDLE
    now_idle = id(status) in _IDLE
    if was_idle or now_idle:
        # Parked nodes are a subset of idle ones; skip the check on the hot active paths.
        run.n_idle += now_idle - was_idle
        parked = now_idle and is_parked(node, status)
        if parked != (was_idle and is_parked(node, old)):
            run.set_parked(node.index, parked)
    node.status = status
    if status is _READY:
        run.set_ready(node.index, True)
    elif status is _WAITING:
        run.set_waiting(node.index, True)
    if id(status) in _TERMINAL:
        detail = node.detail  # None: no retry scheduled (read directly: most nodes have none)
        if detail is not None and detail.retry_deadline is not None:
            detail.retry_deadline = None
            run.set_retry(node.index, None)
        run.open_nodes -= 1
        count_terminal(run, node)


def _node_ready(run: RunView, event: NodeReady, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.status is not _PENDING:
        raise _corrupt(seq, event, f"node {node.node_id!r} is {node.status.value}, not pending")
    node.attempt = 0
    _set_status(run, node, _READY)
    _consume_transition(run, seq, event)


def can_activate(node: NodeState) -> bool:
    """Whether a conditional edge may activate ``node`` now.

    A parked node (Pending without ``depends_on``, or ChangesRequested) and a
    node with a terminal status may be; an active node (Ready, Running,
    Waiting, RetryPending) already has an activation in flight, and a Pending
    node with ``depends_on`` waits for its dependency release, which governs
    its first activation.
    """
    status = node.status
    return (
        status.is_terminal
        or status is _CHANGES_REQUESTED
        or (status is _PENDING and not node.spec.depends_on)
    )


def _edge_activated(run: RunView, event: EdgeActivated, seq: int) -> None:
    edges = run.spec.edges
    if not 0 <= event.edge < len(edges):
        raise _corrupt(seq, event, f"edge position {event.edge} is not in the specification")
    edge = edges[event.edge]
    if (edge.source, edge.target) != (event.source, event.target):
        raise _corrupt(seq, event, f"edge {event.edge} is {edge.source!r} -> {edge.target!r}")
    source = _node(run, seq, event, event.source)
    if (
        event.source_sequence < 1
        or source.outcome_seq != event.source_sequence
        or source.attempt_id is not None
        or source.status is _RETRY_PENDING
    ):
        raise _corrupt(
            seq,
            event,
            f"stale activation: the final outcome of {source.node_id!r} at sequence "
            f"{event.source_sequence} is not its latest ({source.outcome_seq})",
        )
    if run.edge_fired(event.edge) >= event.source_sequence:
        raise _corrupt(
            seq,
            event,
            f"fingerprint (edge {event.edge}, source sequence {event.source_sequence}) was already used",
        )
    target = _node(run, seq, event, event.target)
    if not can_activate(target):
        raise _corrupt(seq, event, f"target {target.node_id!r} is {target.status.value}; it cannot activate")
    if target is not source:
        # A node re-activated by another node's edge can no longer select edges with its old outcome.
        target.outcome_seq = 0
    target.attempt = 0
    target.failure = None
    _set_status(run, target, _READY)
    run.set_edge_fired(event.edge, event.source_sequence)
    _consume_transition(run, seq, event)


def _consume_transition(run: RunView, seq: int, event: Event) -> None:
    run.transitions_used += 1
    if run.transitions_used > run.spec.budgets.max_transitions:
        raise _corrupt(seq, event, "transition budget exceeded without an exhaustion fact")


def _node_started(run: RunView, event: NodeStarted, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.spec.child is not None:
        raise _corrupt(
            seq, event, f"node {node.node_id!r} calls a child workflow; it starts with ChildStarted"
        )
    _start_attempt(run, node, event, seq)


def _child_started(run: RunView, event: ChildStarted, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    call = node.spec.child
    if call is None or (call.workflow_id, call.version) != (event.workflow_id, event.version):
        raise _corrupt(seq, event, f"node {node.node_id!r} does not call {event.workflow_id}@{event.version}")
    if event.child_run_id == run.run_id or run.child_attempt(event.child_run_id) is not None:
        raise _corrupt(seq, event, f"child run id {event.child_run_id} was already used")
    _start_attempt(run, node, event, seq)
    node.child_run_id = event.child_run_id


def _start_attempt(run: RunView, node: NodeState, event: NodeStarted | ChildStarted, seq: int) -> None:
    attempt, attempt_id = event.attempt, event.attempt_id
    child_run_id = event.child_run_id if isinstance(event, ChildStarted) else None
    if node.status is not _READY:
        raise _corrupt(seq, event, f"node {node.node_id!r} is {node.status.value}, not ready")
    if run.attempt(attempt_id) is not None:
        raise _corrupt(seq, event, f"attempt id {attempt_id} was already consumed")
    if attempt != node.attempt + 1:
        raise _corrupt(seq, event, f"attempt {attempt} follows attempt {node.attempt}")
    _set_status(run, node, _RUNNING)
    node.attempt = attempt
    node.total_attempts += 1
    node.attempt_id = attempt_id
    node.attempt_deadline = event.deadline
    run.record_attempt(AttemptRecord(attempt_id, node.node_id, child_run_id=child_run_id), node.index)
    run.attempts_used += 1
    if run.attempts_used > run.spec.budgets.max_attempts:
        raise _corrupt(seq, event, "attempt budget exceeded without an exhaustion fact")


def _child_completed(run: RunView, event: ChildCompleted, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.attempt_id != event.attempt_id or node.child_run_id != event.child_run_id:
        raise _corrupt(
            seq,
            event,
            f"child run {event.child_run_id} is not the open child of attempt {event.attempt_id} "
            f"of {node.node_id!r}",
        )
    node.child_run_id = None


def _outcome_committed(run: RunView, event: NodeOutcomeCommitted, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.status.is_terminal:
        raise _corrupt(seq, event, f"node {node.node_id!r} is already {node.status.value}")
    outcome = event.outcome
    kind = outcome.kind
    if event.attempt_id is not None:
        record = run.attempt(event.attempt_id)
        if record is None or record.node_id != node.node_id:
            raise _corrupt(seq, event, f"attempt {event.attempt_id} is not an attempt of {node.node_id!r}")
        if record.outcome is not None:
            raise _corrupt(
                seq,
                event,
                f"attempt {event.attempt_id} already has a committed outcome (committed-once)",
            )
        if node.attempt_id != event.attempt_id:
            raise _corrupt(seq, event, f"attempt {event.attempt_id} is not active")
        run.close_attempt(event.attempt_id, outcome)
        node.attempt_id = None
        node.attempt_deadline = None
        detail = node.detail  # None: every field below already has its default (most nodes)
        if detail is not None:
            detail.child_run_id = None
            detail.wait = None
            detail.signal = None
            detail.paused_deadline = None
            if detail.out_edges:
                # The activation fingerprint's source half; only edge sources need it.
                detail.outcome_seq = seq
    elif node.attempt_id is not None:
        raise _corrupt(seq, event, f"node {node.node_id!r} has active attempt {node.attempt_id}")
    node.last_outcome = outcome
    run.last_outcome = LastOutcome(node.node_id, kind, event.attempt_id)
    if is_retry_class(node, kind):
        _set_status(run, node, _RETRY_PENDING)
        return
    _set_status(run, node, _OUTCOME_STATUS[kind])


def _node_failed(run: RunView, event: NodeFailed, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.status not in (
        _RETRY_PENDING,
        _CHANGES_REQUESTED,
        _READY,
    ):
        raise _corrupt(seq, event, f"node {node.node_id!r} is {node.status.value}; it cannot fail now")
    node.failure = event.cause
    _set_status(run, node, _FAILED)


def _retry_scheduled(run: RunView, event: RetryScheduled, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    detail = node.detail  # the retry deadline's home (read directly, not through the node's attribute)
    if node.status is not _RETRY_PENDING or (detail is not None and detail.retry_deadline is not None):
        raise _corrupt(seq, event, f"node {node.node_id!r} is not awaiting a retry decision")
    if event.next_attempt != node.attempt + 1 or event.deadline < run.now:
        raise _corrupt(seq, event, "retry attempt or deadline does not follow the current attempt")
    if detail is None:
        detail = node.detail = NodeDetail()
    detail.retry_deadline = event.deadline
    run.set_retry(node.index, event.deadline)
    _consume_transition(run, seq, event)


def _retry_released(run: RunView, event: RetryReleased, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    detail = node.detail
    deadline = None if detail is None else detail.retry_deadline
    if node.status is not _RETRY_PENDING or detail is None or deadline is None:
        raise _corrupt(seq, event, f"node {node.node_id!r} has no scheduled retry")
    if event.at < deadline or event.at != run.now or event.next_attempt != node.attempt + 1:
        raise _corrupt(seq, event, f"retry released at {event.at} before its deadline {deadline}")
    detail.retry_deadline = None
    run.set_retry(node.index, None)
    _set_status(run, node, _READY)
    _consume_transition(run, seq, event)


def _time_advanced(run: RunView, event: VirtualTimeAdvanced, seq: int) -> None:
    if event.to <= run.now:
        raise _corrupt(seq, event, f"virtual time {event.to} does not advance from {run.now}")
    run.now = event.to


def _deadline_expired(run: RunView, event: AttemptDeadlineExpired, seq: int) -> None:
    node = _node(run, seq, event, event.node_id)
    if node.attempt_id != event.attempt_id or node.attempt_deadline != event.deadline:
        raise _corrupt(seq, event, f"attempt {event.attempt_id} has no deadline {event.deadline}")
    if event.deadline > run.now:
        raise _corrupt(seq, event, f"deadline {event.deadline} is after the current time {run.now}")


def _budget_exhausted(run: RunView, event: BudgetExhausted, seq: int) -> None:
    if event.node_id is not None:
        _node(run, seq, event, event.node_id)
        return
    if run.open_nodes:
        raise _corrupt(seq, event, "run budget exhausted while nodes are still open")
    run.exhausted = event


def _cancellation_requested(run: RunView, event: CancellationRequested, seq: int) -> None:
    if run.cancellation is not None:
        raise _corrupt(seq, event, "the run was already cancelled")
    run.cancellation = event


def _run_completed(run: RunView, event: RunCompleted, seq: int) -> None:
    if run.open_nodes:
        raise _corrupt(seq, event, f"{run.open_nodes} node(s) are not terminal")
    expected = run_result(run)
    if event.result != expected:
        raise _corrupt(seq, event, f"result {event.result!r} contradicts the nodes ({expected!r})")
    run.status = _RESULT_STATUS[event.result]


def _active_attempt(run: RunView, event: Event, seq: int, node_id: str, attempt_id: str) -> NodeState:
    node = _node(run, seq, event, node_id)
    if node.attempt_id != attempt_id:
        raise _corrupt(seq, event, f"attempt {attempt_id} is not the active attempt of {node_id!r}")
    return node


def _signal_wait_opened(run: RunView, event: SignalWaitOpened, seq: int) -> None:
    node = _active_attempt(run, event, seq, event.node_id, event.attempt_id)
    if node.status is not _RUNNING or node.child_run_id is not None:
        raise _corrupt(
            seq, event, f"node {node.node_id!r} is {node.status.value}; only running handlers wait"
        )
    if event.deadline is not None and event.deadline <= run.now:
        raise _corrupt(seq, event, f"wait deadline {event.deadline} is not after the current time {run.now}")
    node.wait = SignalWait(event.name, event.token_sha256, event.deadline)
    node.signal = None
    node.wait_expired = False
    if node.attempt_deadline is not None:
        # The attempt deadline is paused while waiting; the wait's own deadline applies.
        node.paused_deadline = max(node.attempt_deadline - run.now, 0)
        node.attempt_deadline = None
    _set_status(run, node, _WAITING)


def _consume(run: RunView, event: SignalAccepted | SignalRejected, seq: int, record: ConsumedSignal) -> None:
    if run.consumed_signal(event.signal_id) is not None:
        raise _corrupt(seq, event, f"signal {event.signal_id} was already consumed")
    run.consume_signal(record)


def _signal_accepted(run: RunView, event: SignalAccepted, seq: int) -> None:
    node = _active_attempt(run, event, seq, event.node_id, event.attempt_id)
    wait = node.wait
    if node.status is not _WAITING or wait is None or wait.name != event.name:
        raise _corrupt(seq, event, f"node {node.node_id!r} is not waiting for signal {event.name!r}")
    _consume(run, event, seq, ConsumedSignal(event.signal_id, node.node_id, accepted=True))
    node.wait = None
    node.signal = AcceptedSignal(event.signal_id, event.name, event.decision)
    if node.paused_deadline is not None:
        node.attempt_deadline = run.now + node.paused_deadline
        node.paused_deadline = None
    _set_status(run, node, _RUNNING)


def _signal_rejected(run: RunView, event: SignalRejected, seq: int) -> None:
    _node(run, seq, event, event.node_id)
    _consume(run, event, seq, ConsumedSignal(event.signal_id, event.node_id, False, event.reason))


def _signal_expired(run: RunView, event: SignalExpired, seq: int) -> None:
    node = _active_attempt(run, event, seq, event.node_id, event.attempt_id)
    wait = node.wait
    if wait is None or wait.name != event.name or wait.deadline != event.deadline:
        raise _corrupt(seq, event, f"node {node.node_id!r} has no wait {event.name!r} until {event.deadline}")
    if event.deadline > run.now:
        raise _corrupt(seq, event, f"wait deadline {event.deadline} is after the current time {run.now}")
    node.wait = None
    node.wait_expired = True


_APPLY: dict[type[Any], Callable[[RunView, Any, int], None]] = {
    SignalWaitOpened: _signal_wait_opened,
    SignalAccepted: _signal_accepted,
    SignalRejected: _signal_rejected,
    SignalExpired: _signal_expired,
    NodeReady: _node_ready,
    NodeStarted: _node_started,
    NodeOutcomeCommitted: _outcome_committed,
    NodeFailed: _node_failed,
    RetryScheduled: _retry_scheduled,
    RetryReleased: _retry_released,
    VirtualTimeAdvanced: _time_advanced,
    AttemptDeadlineExpired: _deadline_expired,
    BudgetExhausted: _budget_exhausted,
    CancellationRequested: _cancellation_requested,
    RunCompleted: _run_completed,
    EdgeActivated: _edge_activated,
    ChildStarted: _child_started,
    ChildCompleted: _child_completed,
}


def apply_event(run: RunView, event: Event, sequence: int) -> None:
    """Apply ``event`` (committed at ``sequence``) to ``run`` in place, or raise CorruptionError."""
    if run.status is not _RUN_RUNNING:
        raise _corrupt(sequence, event, f"the run already completed ({run.status.value})")
    handler = _APPLY.get(type(event))
    if handler is None:
        if isinstance(event, RunCreated):
            raise _corrupt(sequence, event, "the run already exists")
        raise _corrupt(sequence, event, "no reducer rule for this event type")
    handler(run, event, sequence)
    run.sequence = sequence
