"""``decide(state, command)``: the events a command produces, or a typed rejection.

This module answers what each command asks: it checks the command against
the state (a typed :class:`Rejection` when it cannot be honoured, and then
nothing is written) and proposes the command's primary facts. Everything that
follows from those facts in the same atomic batch — edges fired, dependents
released or propagated, retries, budgets, the run's terminal result — is
:mod:`mayfly.reducer._consequences`, and what each fact means to the state is
``_apply``, so the rules live once.

Deterministic: the same state and command always give the same events.
"""

from __future__ import annotations

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    CompleteChild,
    CreateRun,
    DeliverSignal,
    OpenSignalWait,
    Rejection,
    RejectionCode,
    StartNodes,
)
from mayfly.model.errors import LimitExceeded
from mayfly.model.events import (
    AttemptDeadlineExpired,
    BudgetKind,
    CancellationRequested,
    CancellationTarget,
    ChildCompleted,
    ChildStarted,
    Event,
    NodeStarted,
    RetryReleased,
    RunCompleted,
    RunCreated,
    SignalExpired,
    VirtualTimeAdvanced,
)
from mayfly.model.ids import DEDUP_ID, PRIORITY_RANGE, QUEUE_NAME, is_uuid
from mayfly.model.limits import MAX_CHILD_DEPTH
from mayfly.model.outcomes import Cancelled, NodeOutcome, RetryableFailure, check_reason
from mayfly.model.state import NodeState, NodeStatus, RunState, RunStatus
from mayfly.reducer._apply import new_state
from mayfly.reducer._consequences import (
    cancel_open_nodes,
    commit_outcome,
    exhaust_node,
    exhaust_run,
    finish,
    make_ready,
    transition_available,
)
from mayfly.reducer._draft import Draft
from mayfly.reducer.children import child_input, child_outcome, nesting_depth, project_fields
from mayfly.reducer.signals import deliver_signal, open_signal_wait
from mayfly.reducer.validate import check_input, validate_and_hash

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_READY = NodeStatus.READY
_RETRY_PENDING = NodeStatus.RETRY_PENDING
_RUN_RUNNING = RunStatus.RUNNING


__all__ = ["Decision", "decide", "decide_draft"]

Decision = list[Event] | Rejection
"""What ``decide`` returns: the batch to append (possibly empty), or why not."""

_MAX_REQUESTER = 256


def decide(state: RunState | None, command: Command) -> Decision:
    """The events ``command`` produces against ``state`` (``None`` before the run exists).

    An empty list acknowledges a command with nothing new to record (the
    exact re-delivery of a committed outcome, time advanced to "now").
    """
    decision = decide_draft(state, command)
    return decision.events if isinstance(decision, Draft) else decision


def decide_draft(state: RunState | None, command: Command) -> Draft | Decision:
    """:func:`decide`, keeping the draft a batch was decided on: its ``events``, and the run after them.

    The draft is a read-only view of the run as the batch leaves it (its
    index entry, :func:`mayfly.runindex.index_entry`, can be known before the
    batch is appended, without touching ``state``); a decision that records
    nothing, or a rejection, is returned as :func:`decide` returns it.
    """
    if isinstance(command, CreateRun):
        return _create_run(state, command)
    if state is None:
        return Rejection(RejectionCode.RUN_NOT_FOUND, "the run does not exist")
    if isinstance(command, CompleteAttempt):
        return _complete_attempt(state, command)
    if isinstance(command, CompleteChild):
        return _complete_child(state, command)
    if isinstance(command, DeliverSignal):
        return deliver_signal(state, command)
    if state.status is not _RUN_RUNNING:
        return _terminal(state)
    if isinstance(command, StartNodes):
        return _start_nodes(state, command)
    if isinstance(command, AdvanceTime):
        return _advance_time(state, command)
    if isinstance(command, CancelRun):
        return _cancel_run(state, command)
    if isinstance(command, OpenSignalWait):
        return open_signal_wait(state, command)
    raise TypeError(f"decide: unsupported command {type(command).__name__}")


def _terminal(state: RunState) -> Rejection:
    return Rejection(
        RejectionCode.RUN_TERMINAL,
        f"run {state.run_id} already {state.status.value}; it accepts no more commands",
    )


# -- run creation ---------------------------------------------------------------


def _create_run(state: RunState | None, command: CreateRun) -> Draft | Decision:
    if state is not None:
        return Rejection(RejectionCode.RUN_EXISTS, f"run {command.run_id} already exists")
    if not is_uuid(command.run_id):
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"invalid run id {command.run_id!r}: expected a canonical UUID",
        )
    issues, spec_hash = validate_and_hash(command.spec)
    if issues:
        shown = "; ".join(str(issue) for issue in issues[:3])
        more = f" (and {len(issues) - 3} more)" if len(issues) > 3 else ""
        return Rejection(RejectionCode.INVALID_SPEC, f"{shown}{more}")
    try:
        check_input(command.input, "run input")
    except ValueError as exc:
        return Rejection(RejectionCode.INVALID_INPUT, str(exc))
    if command.epoch_ms is not None and command.epoch_ms < 0:
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"run {command.run_id}: epoch_ms must be wall-clock milliseconds >= 0, got {command.epoch_ms}",
        )
    if not isinstance(command.queue, str) or QUEUE_NAME.fullmatch(command.queue) is None:
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"run {command.run_id}: queue {command.queue!r:.80} must match {QUEUE_NAME.pattern}",
        )
    low, high = PRIORITY_RANGE
    if isinstance(command.priority, bool) or not isinstance(command.priority, int):
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"run {command.run_id}: priority must be an int, got {command.priority!r:.80}",
        )
    if not low <= command.priority <= high:
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"run {command.run_id}: priority {command.priority} is outside [{low}, {high}]",
        )
    if command.dedup_id is not None and (
        not isinstance(command.dedup_id, str) or DEDUP_ID.fullmatch(command.dedup_id) is None
    ):
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"run {command.run_id}: dedup id {command.dedup_id!r:.80} must match {DEDUP_ID.pattern}",
        )
    assert spec_hash is not None  # a spec without a JSON form has issues
    parent = command.parent
    if parent is not None:
        problem = _parent_problem(command)
        if problem is not None:
            return problem
    created = RunCreated(
        run_id=command.run_id,
        spec=command.spec,
        spec_hash=spec_hash,
        input=command.input,
        parent=parent,
        epoch_ms=command.epoch_ms,
        queue=command.queue,
        priority=command.priority,
        dedup_id=command.dedup_id,
    )
    draft = Draft(new_state(created))
    draft.events.append(created)
    spec = command.spec
    if spec.initial is not None:
        initial = [draft.index[node_id] for node_id in spec.initial]
    else:
        initial = [
            i for i, node in enumerate(spec.nodes) if not node.depends_on and not draft.node(i).in_edges
        ]
    for i in initial:
        if not make_ready(draft, i, "initial"):
            break
    return draft


def _parent_problem(command: CreateRun) -> Rejection | None:
    parent = command.parent
    assert parent is not None
    if not is_uuid(parent.run_id) or not is_uuid(parent.attempt_id) or parent.run_id == command.run_id:
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"child run {command.run_id}: parent run and attempt ids must be UUIDs of another run",
        )
    depth = parent.depth + nesting_depth(command.spec)
    if parent.depth < 1 or depth > MAX_CHILD_DEPTH:
        return Rejection(
            RejectionCode.INVALID_SPEC,
            f"child run {command.run_id} at depth {parent.depth} would nest {depth} child levels; "
            f"the limit is 1..{MAX_CHILD_DEPTH}",
        )
    return None


# -- starting attempts ----------------------------------------------------------


def _start_nodes(state: RunState, command: StartNodes) -> Draft | Decision:
    chosen: set[str] = set()
    for start in command.starts:
        node = state.node_by_id(start.node_id)
        if node is None:
            return Rejection(RejectionCode.UNKNOWN_NODE, f"run {state.run_id} has no node {start.node_id!r}")
        if start.node_id in chosen:
            return Rejection(RejectionCode.DUPLICATE_START, f"node {start.node_id!r} is started twice")
        chosen.add(start.node_id)
        if node.status is not _READY:
            return Rejection(
                RejectionCode.NODE_NOT_READY,
                f"node {start.node_id!r} of run {state.run_id} is {node.status.value}, not ready",
            )
        if not is_uuid(start.attempt_id):
            return Rejection(
                RejectionCode.INVALID_INPUT,
                f"invalid attempt id {start.attempt_id!r}: expected a UUID",
            )
        if state.attempt(start.attempt_id) is not None:
            return Rejection(
                RejectionCode.ATTEMPT_ID_USED,
                f"attempt id {start.attempt_id} was already consumed in run {state.run_id}",
            )
        problem = _child_start_problem(state, node, start.child_run_id)
        if problem is not None:
            return problem
    if len({s.attempt_id for s in command.starts}) != len(command.starts):
        return Rejection(RejectionCode.ATTEMPT_ID_USED, "the same attempt id is used twice")
    children = [s.child_run_id for s in command.starts if s.child_run_id is not None]
    if len(set(children)) != len(children):
        return Rejection(RejectionCode.INVALID_INPUT, "the same child run id is used twice")
    draft = Draft(state)
    _emit_starts(draft, state, command.starts)
    finish(draft)
    return draft


def _emit_starts(draft: Draft, state: RunState, starts: tuple[AttemptStart, ...]) -> None:
    """Emit the start of each of ``starts`` (validated) on ``draft``, budgets permitting."""
    for start in starts:
        if draft.status is not _RUN_RUNNING:
            break
        i = state.index[start.node_id]
        node = draft.node(i)
        limit = node.spec.max_attempts
        if limit is not None and node.total_attempts >= limit:
            exhaust_node(draft, node, limit)
            continue
        budgets = state.spec.budgets
        if draft.attempts_used >= budgets.max_attempts:
            exhaust_run(draft, BudgetKind.RUN_ATTEMPTS, budgets.max_attempts, budgets.max_attempts + 1)
            break
        deadline_ms = node.spec.retry.attempt_deadline_ms
        deadline = None if deadline_ms is None else draft.now + deadline_ms
        call = node.spec.child
        if call is not None:
            assert start.child_run_id is not None
            draft.emit(
                ChildStarted(
                    node_id=start.node_id,
                    attempt_id=start.attempt_id,
                    attempt=node.attempt + 1,
                    child_run_id=start.child_run_id,
                    workflow_id=call.workflow_id,
                    version=call.version,
                    input=child_input(state.input, node.spec),
                    at=draft.now,
                    deadline=deadline,
                )
            )
            continue
        draft.emit(
            NodeStarted(
                node_id=start.node_id,
                attempt_id=start.attempt_id,
                attempt=node.attempt + 1,
                at=draft.now,
                deadline=deadline,
            )
        )


def _child_start_problem(state: RunState, node: NodeState, child_run_id: str | None) -> Rejection | None:
    if node.spec.child is None:
        if child_run_id is None:
            return None
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"node {node.node_id!r} runs a handler; it takes no child run id",
        )
    if child_run_id is None or not is_uuid(child_run_id):
        return Rejection(
            RejectionCode.INVALID_INPUT,
            f"node {node.node_id!r} calls a child workflow; its start needs a fresh child run id (a UUID), "
            f"got {child_run_id!r}",
        )
    if child_run_id == state.run_id or state.child_attempt(child_run_id) is not None:
        return Rejection(
            RejectionCode.ATTEMPT_ID_USED,
            f"child run id {child_run_id} was already used by run {state.run_id}",
        )
    try:
        check_input(child_input(state.input, node.spec), f"child input of node {node.node_id!r}")
    except ValueError as exc:
        return Rejection(RejectionCode.INVALID_INPUT, str(exc))
    return None


# -- completing attempts --------------------------------------------------------


def _complete_attempt(state: RunState, command: CompleteAttempt) -> Draft | Decision:
    record = state.attempt(command.attempt_id)
    if record is None:
        return Rejection(
            RejectionCode.ATTEMPT_NOT_ACTIVE,
            f"attempt {command.attempt_id} was never started in run {state.run_id}",
        )
    if record.node_id != command.node_id:
        return Rejection(
            RejectionCode.ATTEMPT_NOT_ACTIVE,
            f"attempt {command.attempt_id} belongs to node {record.node_id!r}, not {command.node_id!r}",
        )
    if record.child_run_id is not None:
        return Rejection(
            RejectionCode.CHILD_MISMATCH,
            f"attempt {command.attempt_id} of node {command.node_id!r} is child run "
            f"{record.child_run_id}; report its result with CompleteChild",
        )
    if record.outcome is not None:
        return _redelivery(command.node_id, command.attempt_id, record.outcome, command.outcome)
    if state.status is not _RUN_RUNNING:
        return _terminal(state)
    offered = command.start_next
    if offered:
        problem = _offered_ids_problem(state, command.attempt_id, offered)
        if problem is not None:
            return problem
    draft = Draft(state)
    commit_outcome(draft, state.index[command.node_id], command.outcome, command.attempt_id)
    if offered and draft.status is _RUN_RUNNING:
        _start_newly_ready(draft, state, offered)
    finish(draft)
    return draft


def _offered_ids_problem(state: RunState, attempt_id: str, offered: tuple[str, ...]) -> Rejection | None:
    if len(offered) > len(state.nodes):
        return Rejection(
            RejectionCode.INVALID_INPUT, f"{len(offered)} attempt ids offered for {len(state.nodes)} nodes"
        )
    for candidate in offered:
        if not is_uuid(candidate):
            return Rejection(
                RejectionCode.INVALID_INPUT, f"invalid attempt id {candidate!r}: expected a UUID"
            )
        if candidate == attempt_id or state.attempt(candidate) is not None:
            return Rejection(
                RejectionCode.ATTEMPT_ID_USED,
                f"attempt id {candidate} was already consumed in run {state.run_id}",
            )
    if len(set(offered)) != len(offered):
        return Rejection(RejectionCode.ATTEMPT_ID_USED, "the same attempt id is offered twice")
    return None


def _start_newly_ready(draft: Draft, state: RunState, offered: tuple[str, ...]) -> None:
    """Start, under the offered ids, the handler nodes the draft's outcome made ready (spec order)."""
    ready = sorted(
        i
        for i, node in draft.changed_nodes()
        if node.status is _READY and node.spec.child is None and node.spec.retry.attempt_deadline_ms is None
    )
    pairs = zip(ready, offered, strict=False)
    starts = tuple(AttemptStart(state.nodes[i].spec.id, attempt_id) for i, attempt_id in pairs)
    if starts:
        _emit_starts(draft, state, starts)


def _redelivery(node_id: str, attempt_id: str, committed: NodeOutcome, outcome: NodeOutcome) -> Decision:
    if committed == outcome:
        return []
    if _closed_by_run(committed):
        return Rejection(
            RejectionCode.ATTEMPT_NOT_ACTIVE,
            f"attempt {attempt_id} of node {node_id!r} was closed "
            f"({committed.kind.value}); the late result is rejected",
        )
    return Rejection(
        RejectionCode.CONFLICTING_OUTCOME,
        f"attempt {attempt_id} of node {node_id!r} already committed "
        f"{committed.kind.value}; a different outcome is rejected as corruption",
    )


# -- completing child calls -----------------------------------------------------

_RUN_RESULTS = frozenset({"succeeded", "failed", "blocked", "cancelled"})


def _complete_child(state: RunState, command: CompleteChild) -> Draft | Decision:
    record = state.attempt(command.attempt_id)
    if record is None or record.node_id != command.node_id:
        return Rejection(
            RejectionCode.ATTEMPT_NOT_ACTIVE,
            f"attempt {command.attempt_id} of node {command.node_id!r} was never started in run "
            f"{state.run_id}",
        )
    if record.child_run_id != command.child_run_id:
        return Rejection(
            RejectionCode.CHILD_MISMATCH,
            f"attempt {command.attempt_id} of node {command.node_id!r} started child run "
            f"{record.child_run_id}, not {command.child_run_id}",
        )
    if command.result not in _RUN_RESULTS:
        return Rejection(RejectionCode.INVALID_INPUT, f"unknown child result {command.result!r}")
    node = state.node(state.index[command.node_id])
    call = node.spec.child
    assert call is not None
    try:
        outcome = child_outcome(call, command.child_run_id, command.result, command.output)
    except (LimitExceeded, ValueError) as exc:
        return Rejection(RejectionCode.INVALID_INPUT, f"child run {command.child_run_id} output: {exc}")
    if record.outcome is not None:
        return _redelivery(command.node_id, command.attempt_id, record.outcome, outcome)
    if state.status is not _RUN_RUNNING:
        return _terminal(state)
    draft = Draft(state)
    output = project_fields(command.output, call.outputs) if command.result == "succeeded" else None
    draft.emit(
        ChildCompleted(
            node_id=command.node_id,
            attempt_id=command.attempt_id,
            child_run_id=command.child_run_id,
            result=command.result,
            output=output,
            at=draft.now,
        )
    )
    commit_outcome(draft, node.index, outcome, command.attempt_id)
    finish(draft)
    return draft


def _closed_by_run(outcome: NodeOutcome) -> bool:
    """Outcomes the run assigns itself to close an attempt (cancellation, timeout)."""
    return isinstance(outcome, Cancelled) or (isinstance(outcome, RetryableFailure) and outcome.timeout)


# -- time -----------------------------------------------------------------------


def _advance_time(state: RunState, command: AdvanceTime) -> Draft | Decision:
    if command.to < state.now:
        return Rejection(
            RejectionCode.TIME_WENT_BACKWARDS,
            f"run {state.run_id} is at virtual time {state.now}; cannot go back to {command.to}",
        )
    if command.to == state.now:
        return []
    draft = Draft(state)
    draft.emit(VirtualTimeAdvanced(to=command.to))
    elapsed = state.spec.budgets.max_elapsed_ms
    if elapsed is not None and command.to >= elapsed:
        exhaust_run(draft, BudgetKind.RUN_ELAPSED, elapsed, command.to)
        return draft
    # (deadline, node, kind, attempt): kind 0 = attempt deadline, 1 = signal wait, 2 = retry release.
    due: list[tuple[int, int, int, str]] = []
    for attempt_id, i in state.active_attempts():
        node = state.node(i)
        deadline = node.attempt_deadline
        if deadline is not None and deadline <= command.to:
            due.append((deadline, i, 0, attempt_id))
        if node.wait is not None and node.wait.deadline is not None and node.wait.deadline <= command.to:
            due.append((node.wait.deadline, i, 1, attempt_id))
    for i, deadline in state.pending_retries():
        if deadline <= command.to:
            due.append((deadline, i, 2, ""))
    for deadline, i, kind, attempt_id in sorted(due):
        if draft.status is not _RUN_RUNNING:
            break
        node = draft.node(i)
        if kind == 0:
            draft.emit(AttemptDeadlineExpired(node_id=node.node_id, attempt_id=attempt_id, deadline=deadline))
            timeout = RetryableFailure(reason=f"attempt deadline {deadline} ms expired", timeout=True)
            commit_outcome(draft, i, timeout, attempt_id)
        elif kind == 1:
            wait = node.wait
            assert wait is not None
            draft.emit(
                SignalExpired(node_id=node.node_id, attempt_id=attempt_id, name=wait.name, deadline=deadline)
            )
            expired = RetryableFailure(
                reason=f"signal wait {wait.name!r} expired at {deadline} ms", timeout=True
            )
            commit_outcome(draft, i, expired, attempt_id)
        elif node.status is _RETRY_PENDING and transition_available(draft):
            draft.emit(RetryReleased(node_id=node.node_id, next_attempt=node.attempt + 1, at=draft.now))
    finish(draft)
    return draft


# -- cancellation ---------------------------------------------------------------


def _cancel_run(state: RunState, command: CancelRun) -> Draft | Decision:
    try:
        check_reason(command.reason, "cancellation reason")
    except (LimitExceeded, ValueError) as exc:
        return Rejection(RejectionCode.INVALID_INPUT, str(exc))
    if not command.requester or len(command.requester) > _MAX_REQUESTER:
        return Rejection(RejectionCode.INVALID_INPUT, f"requester must be 1..{_MAX_REQUESTER} characters")
    draft = Draft(state)
    targets = tuple(
        CancellationTarget(state.node(i).node_id, attempt_id, state.node(i).child_run_id)
        for attempt_id, i in state.active_attempts()
    )
    draft.emit(
        CancellationRequested(
            requester=command.requester, reason=command.reason, at=state.now, targets=targets
        )
    )
    cancel_open_nodes(draft, "run cancelled")
    draft.emit(RunCompleted(result="cancelled", at=draft.now))
    return draft
