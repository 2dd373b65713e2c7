"""The run driver: turns committed state into handler invocations and their results into commands.

One driver owns one run inside a hub task. It follows the ADR's loop —
decide, persist, reduce, then effects: ready attempts are all durably started
in one batch before any handler runs; a result is committed only while its
exact attempt is active (late or cross-attempt results are rejected by the
reducer and discarded here); attempts the run closed (cancellation, deadline,
budget) have their tasks cancelled; hub timers become ``AdvanceTime``
commands, so the reducer never reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mayfly.commit import Commit, commit_command
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    DeliverSignal,
    OpenSignalWait,
    Rejection,
    RejectionCode,
    StartNodes,
)
from mayfly.model.errors import CommandRejected, LimitExceeded, TaskCancelled, TaskFailed
from mayfly.model.events import Event as HistoryEvent
from mayfly.model.events import NodeOutcomeCommitted, SignalAccepted
from mayfly.model.ids import IdSource, idempotency_key
from mayfly.model.limits import MAX_REASON_BYTES
from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.signals import AcceptedSignal, SignalToken
from mayfly.model.state import NodeStatus, RunState
from mayfly.recovery import BlockUnavailable, ReconcileAttempt, RecoveryEffect
from mayfly.runtime.registry import HandlerEntry, HandlerRegistry
from mayfly.runtime.request import DependencyResult, HandlerRequest, clone_json
from mayfly.runtime.signals import WaitForSignal
from mayfly.snapshot import make_snapshot
from mayfly.substrate import (
    CancellationHandle,
    Channel,
    Event,
    Task,
    WaitTimeout,
    current_hub,
    current_task,
    offload,
)

__all__ = ["HandlerResult", "Observer", "RunDriver", "SignalRequest", "invoke_handler"]

_OUTCOME_TYPES = (
    Succeeded,
    ChangesRequested,
    RetryableFailure,
    PermanentFailure,
    Blocked,
    Cancelled,
    Skipped,
)
_PERMANENT_ERRORS = ("mayfly.model.errors.LimitExceeded", "TypeError")


def _bounded(text: str) -> str:
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_REASON_BYTES:
        return text
    # Exception text is diagnostic, not durable data: cut at the bound, marking the cut.
    return raw[: MAX_REASON_BYTES - 16].decode("utf-8", "ignore") + " [...truncated]"


HandlerResult = NodeOutcome | WaitForSignal
"""What a handler may return: an outcome, or a request to wait for a signal."""


def invoke_handler(entry: HandlerEntry, request: HandlerRequest) -> HandlerResult:
    """Call the handler (offloaded unless cooperative) and return a valid outcome or wait.

    A return value that is not an outcome becomes a PermanentFailure naming
    what was returned; exceptions propagate to the caller's task.
    """
    result: Any = entry.fn(request) if entry.cooperative else offload(entry.fn, request)
    if isinstance(result, (*_OUTCOME_TYPES, WaitForSignal)):
        checked: HandlerResult = result
        return checked
    return PermanentFailure(
        reason=_bounded(
            f"handler {entry.ref} returned {type(result).__name__}, expected an outcome such as "
            "Succeeded(output=...)"
        )
    )


def failure_outcome(error: TaskFailed) -> NodeOutcome:
    """The typed outcome of a handler that raised: retryable unless the error is a contract breach."""
    reason = _bounded(f"handler raised {error.error_type}: {error.error_message}")
    if error.error_type in _PERMANENT_ERRORS or isinstance(error.__cause__, LimitExceeded):
        return PermanentFailure(reason=reason)
    return RetryableFailure(reason=reason)


class RunDriver:
    """Drives one run to its terminal result inside the current hub task."""

    def __init__(
        self,
        *,
        detach_on_wait: bool = False,
        observer: Observer | None = None,
        journal: WorkflowJournal,
        registry: HandlerRegistry,
        ids: IdSource,
        state: RunState,
        lease: RecoveryLeaseGuard | None,
        concurrent: bool,
        snapshot_every: int,
        lease_ttl_ms: int,
    ) -> None:
        self.journal = journal
        self.registry = registry
        self.ids = ids
        self.state = state
        self.lease = lease
        self.concurrent = concurrent
        self.snapshot_every = snapshot_every
        self.lease_ttl_ms = lease_ttl_ms
        self.detach_on_wait = detach_on_wait
        self.observer = observer
        self.hub = current_hub()
        # Virtual time continues from the recorded time; downtime is not counted, so
        # a restored deadline is never reached early.
        self._epoch = self.hub.now_ms() - state.now
        self._renewed_at = self.hub.now_ms()
        self._since_snapshot = 0
        self._done: Channel[Task[HandlerResult]] = Channel()
        self._tasks: dict[str, Task[HandlerResult]] = {}
        self._task_attempt: dict[Task[HandlerResult], tuple[str, str]] = {}
        self._cancel_requests: list[tuple[str, str]] = []
        self._signal_requests: list[SignalRequest] = []
        self._accepted: dict[str, int] = {}
        self.rejected_results = 0
        self.detached = False
        self._timed_nodes = [
            i for i, node in enumerate(state.spec.nodes) if node.retry.attempt_deadline_ms is not None
        ]

    # -- committing ---------------------------------------------------------------

    @property
    def fence(self) -> int | None:
        """The fencing token appends carry (``None`` when the run is driven without a lease)."""
        return None if self.lease is None else self.lease.fencing_token

    def run_now(self) -> int:
        """The run's virtual time now: recorded time plus hub time elapsed since this driver began."""
        return max(self.state.now, self.hub.now_ms() - self._epoch)

    def commit(self, command: Command) -> Commit | Rejection:
        """Commit ``command``; a rejection is returned (nothing written), journal errors propagate."""
        try:
            result = commit_command(self.journal, self.state, command, ids=self.ids, fence=self.fence)
        except CommandRejected as rejected:
            assert isinstance(rejected.rejection, Rejection)
            return rejected.rejection
        self.state = result.state
        if self.observer is not None and result.events:
            self.observer(self.state, result.events)
        if result.records:
            self._since_snapshot += len(result.records)
            if self._since_snapshot >= self.snapshot_every or self.state.status.is_terminal:
                self.journal.write_snapshot(self.state.run_id, make_snapshot(self.state, result.records[-1]))
                self._since_snapshot = 0
        for event in result.events:
            if isinstance(event, SignalAccepted):
                self._accepted[event.attempt_id] = self.state.index[event.node_id]
        self._cancel_closed_attempts(result.events)
        return result

    def commit_or_raise(self, command: Command) -> Commit:
        """Commit a command the driver itself derived from state; a rejection is a bug, so raise."""
        result = self.commit(command)
        if isinstance(result, Rejection):
            raise CommandRejected(result, f"{type(command).__name__} rejected: {result}")
        return result

    def advance_time(self) -> None:
        """Record the current virtual time if it moved (this is what releases retries and expiries)."""
        now = self.run_now()
        if now > self.state.now:
            self.commit_or_raise(AdvanceTime(now))

    def request_cancel(self, requester: str, reason: str) -> None:
        """Ask the driver to cancel the run at its next step (from another task on the same hub)."""
        self._cancel_requests.append((requester, reason))
        # Wake the driver if it is waiting for handler results.
        self._done.send(_WAKE)

    def request_signal(self, request: SignalRequest) -> None:
        """Queue a signal delivery for the driver (from another task); ``request.done`` is set after."""
        self._signal_requests.append(request)
        self._done.send(_WAKE)

    # -- the loop -----------------------------------------------------------------

    def drive(self, effects: tuple[RecoveryEffect, ...] = ()) -> RunState:
        """Run until the terminal result is committed and return the final state."""
        for effect in effects:
            if isinstance(effect, ReconcileAttempt):
                node = self.state.node_by_id(effect.node_id)
                assert node is not None
                self._launch(node.index, effect.attempt_id)
            elif isinstance(effect, BlockUnavailable):
                self._block_unavailable(effect.node_id, effect.attempt_id)
        # Retry timers, waits and ready nodes are derived from state by the loop itself.
        while not self.state.status.is_terminal:
            if self._cancel_requests:
                requester, reason = self._cancel_requests.pop(0)
                self.commit(CancelRun(requester, reason))
                continue
            if self._signal_requests:
                self._deliver(self._signal_requests.pop(0))
                continue
            if self._due():
                self.advance_time()
                continue
            ready = self.state.ready_nodes()
            if ready:
                self._start(ready)
                continue
            if self._resume_accepted():
                continue
            if not self._wait():
                self.detached = True
                break
        self._cancel_closed_attempts(())
        return self.state

    def _due(self) -> bool:
        deadline = self._next_deadline()
        return deadline is not None and deadline <= self.run_now()

    def _next_deadline(self, *, waits: bool = True) -> int | None:
        """The earliest virtual time something is due: a retry, an attempt or wait deadline, the budget."""
        state = self.state
        deadlines = [deadline for _, deadline in state.pending_retries()]
        # Only nodes whose spec sets an attempt deadline can have one: no scan of every attempt.
        for index in self._timed_nodes:
            attempt_deadline = state.node(index).attempt_deadline
            if attempt_deadline is not None:
                deadlines.append(attempt_deadline)
        if waits:
            for node in state.waiting_nodes():
                if node.wait is not None and node.wait.deadline is not None:
                    deadlines.append(node.wait.deadline)
        elapsed = state.spec.budgets.max_elapsed_ms
        if elapsed is not None:
            deadlines.append(elapsed)
        return min(deadlines) if deadlines else None

    def _start(self, ready: list[str]) -> None:
        available = []
        for node_id in ready:
            node = self.state.node_by_id(node_id)
            assert node is not None
            if node.spec.handler is not None and self.registry.is_available(node.spec.handler):
                available.append(node_id)
            else:
                self._block_unavailable(node_id, None)
                return
        if any(self.state.node_by_id(n).spec.retry.attempt_deadline_ms for n in available):  # type: ignore[union-attr]
            self.advance_time()  # attempt deadlines are measured from the recorded start time
            if self.state.status.is_terminal or self.state.ready_nodes() != ready:
                return
        starts = tuple(AttemptStart(node_id, self.ids.new_id()) for node_id in available)
        self.commit_or_raise(StartNodes(starts))
        launched = [
            (self.state.index[s.node_id], s.attempt_id)
            for s in starts
            if self.state.node(self.state.index[s.node_id]).attempt_id == s.attempt_id
        ]
        if self.concurrent:
            for index, attempt_id in launched:
                self._launch(index, attempt_id)
            return
        # Current-task mode: the started attempts run serially, in specification order.
        for index, attempt_id in sorted(launched):
            if self.state.node(index).attempt_id == attempt_id:
                self._run_inline(index, attempt_id)

    def _run_inline(self, index: int, attempt_id: str) -> None:
        entry, request = self._request(index, attempt_id, current_task().cancellation)
        try:
            result = invoke_handler(entry, request)
        except TaskCancelled:
            raise
        except Exception as exc:  # the handler's failure becomes a typed outcome
            failed = TaskFailed(entry.ref, type(exc).__qualname__, str(exc))
            failed.__cause__ = exc
            result = failure_outcome(failed)
        self._complete(index, attempt_id, result)

    def _block_unavailable(self, node_id: str, attempt_id: str | None) -> None:
        """Record a node whose handler is missing as Blocked (ARCHITECTURE section 11)."""
        if attempt_id is None:
            attempt_id = self.ids.new_id()
            self.commit_or_raise(StartNodes((AttemptStart(node_id, attempt_id),)))
            if self.state.status.is_terminal:
                return
        self.commit(CompleteAttempt(node_id, attempt_id, Blocked(reason="handler unavailable")))

    def _request(
        self, index: int, attempt_id: str, cancellation: CancellationHandle
    ) -> tuple[HandlerEntry, HandlerRequest]:
        state = self.state
        node = state.node(index)
        assert node.spec.handler is not None
        entry = self.registry.resolve(node.spec.handler)
        assert entry is not None
        # Upstream outcomes: the depends_on prerequisites, then the sources of incoming
        # conditional edges (a correction loop's implement sees its reviewer's verdict).
        dependencies = {}
        upstream = list(node.spec.depends_on)
        upstream += [
            e.source for e in state.spec.edges if e.target == node.node_id and e.source not in upstream
        ]
        for source in upstream:
            other = state.node_by_id(source)
            if other is not None and other.last_outcome is not None:
                dependencies[source] = DependencyResult.of(source, other.last_outcome)
        request = HandlerRequest(
            run_id=state.run_id,
            node_id=node.node_id,
            handler=node.spec.handler,
            attempt=node.attempt,
            attempt_id=attempt_id,
            idempotency_key=idempotency_key(state.run_id, node.node_id, attempt_id),
            deadline=node.attempt_deadline,
            input=clone_json(node.spec.input),
            run_input=clone_json(state.input),
            dependencies=dependencies,
            cancellation=cancellation,
            node_attempts=node.total_attempts,
            signal=None
            if node.signal is None
            else AcceptedSignal(node.signal.signal_id, node.signal.name, clone_json(node.signal.decision)),
        )
        return entry, request

    def _launch(self, index: int, attempt_id: str) -> None:
        node = self.state.node(index)
        name = f"{node.node_id}#{node.attempt}"
        # The task's own cancellation handle is the one the handler sees.
        holder: dict[str, HandlerRequest] = {}

        def attempt() -> HandlerResult:
            return invoke_handler(entry, holder["request"])

        task: Task[HandlerResult] = self.hub.spawn(attempt, name=name, notify=self._done)
        entry, request = self._request(index, attempt_id, task.cancellation)
        holder["request"] = request
        self._tasks[attempt_id] = task
        self._task_attempt[task] = (node.node_id, attempt_id)

    def _wait(self) -> bool:
        """Park until a handler finishes, a request arrives or something falls due.

        Returns False when the run can only progress through an external
        signal and this driver detaches (``detach_on_wait``): the run stays
        durably parked for whoever delivers the signal and resumes it.
        """
        if not self._tasks:
            waiting = bool(self.state.waiting_nodes())
            if waiting and self.detach_on_wait and self._next_deadline(waits=False) is None:
                return False
            if not waiting and self._next_deadline() is None:
                raise RuntimeError(
                    f"run {self.state.run_id} cannot make progress: nothing ready, running or scheduled"
                )
        deadline = self._next_deadline()
        renew_at = self._renewed_at + self.lease_ttl_ms // 3 if self.lease is not None else None
        wake_at = min(
            [t for t in (None if deadline is None else self._epoch + deadline, renew_at) if t is not None],
            default=None,
        )
        timeout = None if wake_at is None else max(wake_at - self.hub.now_ms(), 0) / 1000
        try:
            task = self._done.receive(timeout=timeout)
        except WaitTimeout:
            self._renew_if_due()
            return True
        self._renew_if_due()
        if task is not _WAKE:
            self._finished(task)
        return True

    def _resume_accepted(self) -> bool:
        """Re-invoke attempts whose wait accepted a signal (same attempt id, signal attached)."""
        resumed = False
        while self._accepted:
            attempt_id, index = self._accepted.popitem()
            node = self.state.node(index)
            if node.attempt_id == attempt_id and node.signal is not None and attempt_id not in self._tasks:
                if not self.concurrent:
                    self._run_inline(index, attempt_id)
                else:
                    self._launch(index, attempt_id)
                resumed = True
        return resumed

    def _deliver(self, request: SignalRequest) -> None:
        result = self.commit(
            DeliverSignal(
                node_id=request.node_id,
                signal_id=request.signal_id,
                token=request.token,
                decision=request.decision,
                name=request.name,
            )
        )
        request.result = result if isinstance(result, Rejection) else result.events
        request.done.set()

    def _renew_if_due(self) -> None:
        if self.lease is None:
            return
        now = self.hub.now_ms()
        if now - self._renewed_at >= self.lease_ttl_ms // 3:
            self.lease.renew(self.lease_ttl_ms)
            self._renewed_at = now

    def _finished(self, task: Task[HandlerResult]) -> None:
        node_id, attempt_id = self._task_attempt.pop(task)
        self._tasks.pop(attempt_id, None)
        try:
            result = task.result()
        except TaskCancelled:
            return  # the run closed this attempt; its outcome is already committed
        except TaskFailed as failed:
            result = failure_outcome(failed)
        self._complete(self.state.index[node_id], attempt_id, result)

    def _complete(self, index: int, attempt_id: str, outcome: HandlerResult) -> None:
        node = self.state.node(index)
        if node.attempt_id != attempt_id:
            self.rejected_results += 1
            return
        if isinstance(outcome, WaitForSignal):
            self._open_wait(index, attempt_id, outcome)
            return
        if isinstance(outcome, RetryableFailure | PermanentFailure):
            self.advance_time()  # a retry's delay is added to the time its outcome is committed
            if self.state.node(index).attempt_id != attempt_id:
                self.rejected_results += 1
                return
        result = self.commit(CompleteAttempt(node.node_id, attempt_id, outcome))
        if isinstance(result, Rejection):
            if result.code in (RejectionCode.ATTEMPT_NOT_ACTIVE, RejectionCode.RUN_TERMINAL):
                self.rejected_results += 1  # a late result for an attempt the run already closed
                return
            raise CommandRejected(result, f"result of attempt {attempt_id} rejected: {result}")

    def _open_wait(self, index: int, attempt_id: str, wait: WaitForSignal) -> None:
        if wait.timeout_ms is not None:
            self.advance_time()  # the wait's deadline counts from the time it is opened
        node = self.state.node(index)
        if node.attempt_id != attempt_id:
            self.rejected_results += 1
            return
        self.commit_or_raise(
            OpenSignalWait(
                node_id=node.node_id,
                attempt_id=attempt_id,
                name=wait.name,
                token_sha256=wait.token.digest,
                timeout_ms=wait.timeout_ms,
            )
        )

    def _cancel_closed_attempts(self, events: tuple[HistoryEvent, ...]) -> None:
        """Cancel the tasks of attempts the run just closed itself (cancellation, deadline, budget)."""
        if self.state.status.is_terminal:
            for task in self._tasks.values():
                if not task.done:
                    task.cancel("run completed")
            return
        for event in events:
            if isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                closed = self._tasks.get(event.attempt_id)
                if closed is not None and not closed.done:
                    closed.cancel(f"attempt closed: {event.outcome.kind.value}")

    @property
    def waiting_nodes(self) -> list[str]:
        """Nodes parked on a durable wait (none until signals exist)."""
        return [n.node_id for n in self.state.nodes if n.status is NodeStatus.WAITING]


_WAKE: Any = object()

Observer = Callable[[RunState, tuple[HistoryEvent, ...]], None]
"""Called after every commit with the new state and the committed events (progress, timelines)."""


class SignalRequest:
    """A signal delivery queued for the driver by another task, and its result once processed."""

    __slots__ = ("decision", "done", "name", "node_id", "result", "signal_id", "token")

    def __init__(
        self, node_id: str, signal_id: str, token: SignalToken, decision: Any, name: str | None
    ) -> None:
        self.node_id = node_id
        self.signal_id = signal_id
        self.token = token
        self.decision = decision
        self.name = name
        self.done = Event()
        self.result: Any = None
