"""The run driver: turns committed state into handler invocations and their results into commands.

One driver owns one run inside a hub task. It follows the ADR's loop —
decide, persist, reduce, then effects: ready attempts are all durably started
in one batch before any handler runs; a result is committed only while its
exact attempt is active (late or cross-attempt results are rejected by the
reducer and discarded here); attempts the run closed (cancellation, deadline,
budget) have their tasks cancelled; hub timers become ``AdvanceTime``
commands, so the reducer never reads a clock.

Before anything else, a driver advances the run's virtual time to the wall
time elapsed since the run's epoch (:func:`mayfly.runtime._time.catch_up`):
what fell due while no process ran fires first, in deadline order, and an
in-flight attempt closed that way is not re-invoked.

Child calls: once ``ChildStarted`` is committed, the driver creates the child
run (under its own recovery lease, held by the same owner) and drives it with
a nested driver, in a task of its own (concurrent mode) or inline (current-task
mode); the child's terminal result is committed on the parent with
``CompleteChild``. When the parent closes a child-call attempt (cancellation,
deadline, budget) the child run is cancelled in turn through its own journal,
naming the parent as requester, which cascades to its own children. A child
parked on a signal never detaches by itself: it reports its waits, and the
parent detaches with them (see :meth:`RunDriver.waits`); resuming the parent
resumes the child.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec.structs

from mayfly.commit import Commit, commit_command
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard, RecoveryLeaseStore
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
from mayfly.model.errors import (
    CommandRejected,
    CorruptionError,
    LimitExceeded,
    MayflyError,
    NonRetryable,
    RunNotFound,
    TaskCancelled,
    TaskFailed,
)
from mayfly.model.events import (
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    NodeOutcomeCommitted,
    SignalAccepted,
)
from mayfly.model.events import Event as HistoryEvent
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
from mayfly.model.state import NodeState, RunState
from mayfly.recovery import (
    ReconcileAttempt,
    ReconcileChild,
    RecoveryEffect,
    check_unfinished_handlers,
    inspect_run,
    recovery_effects,
    resume_run,
)
from mayfly.reducer import decode_event
from mayfly.reducer.children import child_completion, child_create_run
from mayfly.runtime._time import catch_up as catch_up_to
from mayfly.runtime._time import next_deadline, run_time_at
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
    sleep,
)

__all__ = [
    "ChildReport",
    "HandlerResult",
    "Observer",
    "RunDriver",
    "SignalRequest",
    "cancel_run_cascade",
    "invoke_handler",
]

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
    raw = text.encode("utf-8", "replace")  # a lone surrogate in exception text becomes "?"
    if len(raw) <= MAX_REASON_BYTES:
        return raw.decode("utf-8")
    # Exception text is diagnostic, not durable data: cut at the bound, marking the cut.
    return raw[: MAX_REASON_BYTES - 16].decode("utf-8", "ignore") + " [...truncated]"


def _described(error: BaseException) -> str:
    """``KeyError: 'sku'``: the exception's type and text, even when its ``__str__`` fails."""
    try:
        text = str(error)
    except Exception:  # a handler's exception must not break the recording of its failure
        text = "<unprintable>"
    return f"{type(error).__qualname__}: {text}"


HandlerResult = NodeOutcome | WaitForSignal
"""What a handler may return: an outcome, or a request to wait for a signal."""


def invoke_handler(entry: HandlerEntry, request: HandlerRequest) -> HandlerResult:
    """Call the handler (offloaded unless cooperative) and return a valid outcome or wait.

    A return value that is not an outcome becomes a PermanentFailure naming
    what was returned, and so does a raised :class:`NonRetryable` or an
    exception of a type the registration names ``non_retryable``, naming the
    exception; other exceptions propagate to the caller's task.
    """
    permanent: tuple[type[Exception], ...] = (NonRetryable, *entry.non_retryable)
    try:
        result: Any = entry.fn(request) if entry.cooperative else offload(entry.fn, request)
    except TaskCancelled:
        raise  # cancellation is never the handler's failure, even under non_retryable=(Exception,)
    except permanent as exc:
        reason = f"handler raised {_described(exc)}"
        if isinstance(exc, NonRetryable) and exc.__cause__ is not None:
            reason += f" (from {_described(exc.__cause__)})"
        return PermanentFailure(reason=_bounded(reason))
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


class ChildReport:
    """What driving a child run came to: its final state and either the parent's completion or its waits."""

    __slots__ = ("completion", "state", "waiting")

    def __init__(self, state: RunState, completion: CompleteChild | None, waiting: dict[str, str]) -> None:
        self.state = state
        self.completion = completion
        """The parent's ``CompleteChild`` once the child is terminal; ``None`` while it is parked."""
        self.waiting = waiting
        """The parked child's waits (``node`` or ``node/child-node`` -> signal name)."""


_Work = HandlerResult | ChildReport


class RunDriver:
    """Drives one run to its terminal result inside the current hub task.

    ``leases`` and ``owner`` are what child runs are leased with (the
    parent's store and owner; without a store, children run unleased like
    their parent); ``drivers`` is the runtime's table of live drivers by run
    id, so signals and cancellations addressed to a child run reach its
    nested driver. ``wall_ms`` is the wall-clock reading the run's virtual
    time is synchronised with (the hub clock's, read now, by default): a
    creator passes the reading it recorded as the run's epoch.
    """

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
        leases: RecoveryLeaseStore | None = None,
        owner: str = "mayfly",
        drivers: dict[str, RunDriver] | None = None,
        outer: RunDriver | None = None,
        wall_ms: int | None = None,
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
        self.leases = leases
        self.owner = owner
        self.drivers = drivers
        self.outer = outer
        self.hub = current_hub()
        # The hub time at which the run's virtual time is 0. Virtual time is the wall time since the
        # run's epoch (never less than the recorded time), and from here on follows the hub's monotonic
        # clock, so a wall-clock jump while this driver runs moves no deadline.
        wall = self.hub.clock.wall_ms() if wall_ms is None else wall_ms
        self._origin = self.hub.now_ms() - run_time_at(state, wall)
        self._renewed_at = self.hub.now_ms()
        self._since_snapshot = 0
        self._done: Channel[Task[_Work]] = Channel()
        self._tasks: dict[str, Task[_Work]] = {}
        self._task_attempt: dict[Task[_Work], tuple[str, str]] = {}
        # Child calls, by parent attempt id: started or reconciled and not yet reported ...
        self._children: dict[str, tuple[str, str]] = {}
        # ... and parked on a signal, with the waits they reported.
        self._parked_children: dict[str, tuple[str, str, dict[str, str]]] = {}
        # Nested drivers now driving a child run (child run id -> parent node, driver).
        self._child_drivers: dict[str, tuple[str, RunDriver]] = {}
        # Cancellations for child runs whose driver does not exist yet, and those already requested.
        self._pending_child_cancels: dict[str, tuple[str, str]] = {}
        self._cancelled_children: set[str] = set()
        self._cancel_requests: list[tuple[str, str]] = []
        self._signal_requests: list[SignalRequest] = []
        self._accepted: dict[str, int] = {}
        self.rejected_results = 0
        self._timed_nodes = [
            i for i, node in enumerate(state.spec.nodes) if node.retry.attempt_deadline_ms is not None
        ]

    # -- committing ---------------------------------------------------------------

    @property
    def fence(self) -> int | None:
        """The fencing token appends carry (``None`` when the run is driven without a lease)."""
        return None if self.lease is None else self.lease.fencing_token

    def run_now(self) -> int:
        """The run's virtual time now: wall time since its epoch when it began, plus hub time since."""
        return max(self.state.now, self.hub.now_ms() - self._origin)

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

    def catch_up(self) -> None:
        """Advance virtual time to now, firing what fell due meanwhile one deadline at a time, in order."""
        commit = self.commit_or_raise  # commits against self.state, which it keeps current
        catch_up_to(
            self.state, self.run_now(), lambda _, command: commit(command).state, timed=self._timed_nodes
        )

    def request_cancel(self, requester: str, reason: str) -> None:
        """Ask the driver to cancel the run at its next step (from another task on the same hub)."""
        self._cancel_requests.append((requester, reason))
        # Wake the driver if it is waiting for handler results.
        self._done.send(_WAKE)
        if not self.concurrent:
            # Current-task mode drives a child inline, so this driver only sees the request once
            # the child ends: cancel the child now, naming this run, and let the cascade follow.
            why = _bounded(f"parent run {self.state.run_id} cancelled: {reason}")
            for node_id, child_run_id in list(self._children.values()):
                self._cancelled_children.add(child_run_id)
                live = self._child_drivers.get(child_run_id)
                if live is not None:
                    live[1].request_cancel(self._child_requester(node_id), why)
                else:  # still being opened: cancelled as soon as its driver exists
                    self._pending_child_cancels[child_run_id] = (self._child_requester(node_id), why)

    def request_signal(self, request: SignalRequest) -> None:
        """Queue a signal delivery for the driver (from another task); ``request.done`` is set after."""
        self._signal_requests.append(request)
        self._done.send(_WAKE)

    # -- the loop -----------------------------------------------------------------

    def drive(self, effects: tuple[RecoveryEffect, ...] = ()) -> RunState:
        """Run until the terminal result is committed and return the final state."""
        try:
            self._drive(effects)
        except BaseException as exc:
            self._abandon_signal_requests(exc)
            raise
        # A signal queued while the run ended (or its children were joined) is still answered:
        # recorded if the run is only parked, refused (run_terminal) if it ended.
        while self._signal_requests:
            self._deliver(self._signal_requests.pop(0))
        return self.state

    def _abandon_signal_requests(self, exc: BaseException) -> None:
        """Wake every task waiting on a queued signal: the driver stopped before recording it."""
        for request in self._signal_requests:
            request.error = MayflyError(
                f"run {self.state.run_id} stopped being driven ({type(exc).__name__}) before signal "
                f"{request.signal_id} was recorded; nothing was written for it, deliver it again"
            )
            request.done.set()
        self._signal_requests.clear()

    def _drive(self, effects: tuple[RecoveryEffect, ...]) -> RunState:
        if self.state.status.is_terminal:
            self._cancel_recorded_children()
        else:
            self.catch_up()
        for effect in effects:
            # Catching up (or an inline child reported earlier in this loop) may have closed the
            # attempt meanwhile: an expired attempt is not re-invoked.
            if isinstance(effect, ReconcileAttempt):
                node = self._node(effect.node_id)
                if node.attempt_id == effect.attempt_id:
                    self._launch(node.index, effect.attempt_id)
            elif isinstance(effect, ReconcileChild):
                if self._node(effect.node_id).attempt_id == effect.attempt_id:
                    self._start_child(effect.node_id, effect.attempt_id, effect.child_run_id, None)
                elif effect.child_run_id not in self._cancelled_children:
                    # Its attempt closed before the child run was picked up again: the child run
                    # must not outlive it.
                    self._cancelled_children.add(effect.child_run_id)
                    why = f"parent run {self.state.run_id} closed attempt {effect.attempt_id}"
                    self._cascade_cancel(effect.child_run_id, self._child_requester(effect.node_id), why)
        # Retry timers, waits and ready nodes are derived from state by the loop itself.
        while not self.state.status.is_terminal:
            # Current-task mode can run handler after handler without ever parking in _wait.
            self._renew_if_due()
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
                break  # parked on a signal: detached
        self._cancel_closed_attempts(())
        self._join_children()
        return self.state

    def _due(self) -> bool:
        deadline = self._next_deadline()
        return deadline is not None and deadline <= self.run_now()

    def _next_deadline(self, *, waits: bool = True) -> int | None:
        """The earliest virtual time something is due (see :func:`mayfly.runtime._time.next_deadline`).

        ``waits=False`` leaves out deadlines that must not keep a detaching
        driver from returning; resume restores them from the history.
        """
        return next_deadline(self.state, waits=waits, timed=self._timed_nodes)

    def _start(self, ready: list[str]) -> None:
        # Every handler these nodes need was checked before this driver began: by execute for the
        # whole specification, by resume for every unfinished node (ARCHITECTURE section 11).
        if any(self._node(n).spec.retry.attempt_deadline_ms for n in ready):
            self.advance_time()  # attempt deadlines are measured from the recorded start time
            if self.state.status.is_terminal or self.state.ready_nodes() != ready:
                return
        starts = tuple(
            AttemptStart(
                node_id,
                self.ids.new_id(),
                child_run_id=self.ids.new_id() if self._node(node_id).spec.child else None,
            )
            for node_id in ready
        )
        commit = self.commit_or_raise(StartNodes(starts))
        children = {e.attempt_id: e for e in commit.events if isinstance(e, ChildStarted)}
        launched = [
            (self.state.index[s.node_id], s.attempt_id)
            for s in starts
            if self.state.node(self.state.index[s.node_id]).attempt_id == s.attempt_id
        ]
        if self.concurrent:
            for index, attempt_id in launched:
                self._dispatch(index, attempt_id, children.get(attempt_id))
            return
        # Current-task mode: the started attempts run serially, in specification order.
        for index, attempt_id in sorted(launched):
            if self.state.node(index).attempt_id == attempt_id:
                self._dispatch(index, attempt_id, children.get(attempt_id))

    def _dispatch(self, index: int, attempt_id: str, started: ChildStarted | None) -> None:
        """Run a freshly started attempt: its handler, or the child run its ChildStarted names."""
        if started is not None:
            create = child_create_run(self.state, started)
            self._start_child(started.node_id, attempt_id, started.child_run_id, create)
        elif self.concurrent:
            self._launch(index, attempt_id)
        else:
            self._run_inline(index, attempt_id)

    def _run_inline(self, index: int, attempt_id: str) -> None:
        entry, request = self._request(index, attempt_id, current_task().cancellation)
        # This task is busy in the handler, so another one keeps the lease alive meanwhile.
        keeper = self.hub.spawn(self._keep_lease, name=f"lease keeper of {self.state.run_id}")
        try:
            result = invoke_handler(entry, request)
        except TaskCancelled:
            raise
        except Exception as exc:  # the handler's failure becomes a typed outcome
            failed = TaskFailed(entry.ref, type(exc).__qualname__, str(exc))
            failed.__cause__ = exc
            result = failure_outcome(failed)
        finally:
            keeper.cancel("inline handler returned")
        self._complete(index, attempt_id, result)

    def _keep_lease(self) -> None:
        """Renew the lease (and inline parents' leases) every third of the TTL while a handler runs inline."""
        while True:
            sleep(self.lease_ttl_ms / 3 / 1000)
            self._renew_if_due()

    def _node(self, node_id: str) -> NodeState:
        node = self.state.node_by_id(node_id)
        assert node is not None, node_id
        return node

    # -- child runs -----------------------------------------------------------------

    def _child_requester(self, node_id: str) -> str:
        return f"parent {self.state.run_id}/{node_id}"

    def _start_child(
        self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None
    ) -> None:
        """Drive the child run of a started child-call attempt: in a task of its own, or inline.

        ``create`` is the child's ``CreateRun`` for a fresh start, ``None`` to
        reconcile after a restart (resume the child, or create it if it never was).
        """
        self._children[attempt_id] = (node_id, child_run_id)
        self._parked_children.pop(attempt_id, None)
        if self.concurrent:
            node = self._node(node_id)
            task: Task[_Work] = self.hub.spawn(
                lambda: self._drive_child(node_id, attempt_id, child_run_id, create),
                name=f"{node_id}#{node.attempt} child {child_run_id}",
                notify=self._done,
            )
            self._tasks[attempt_id] = task
            self._task_attempt[task] = (node_id, attempt_id)
            return
        report = self._drive_child(node_id, attempt_id, child_run_id, create)
        if self._cancel_requests:
            # The parent is being cancelled: its CancelRun closes this attempt, not the child's result.
            self._children.pop(attempt_id, None)
            return
        self._child_done(attempt_id, report)

    def _drive_child(
        self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None
    ) -> ChildReport:
        """Open child run ``child_run_id`` (create or resume it) and drive it until it ends or parks."""
        call = self._node(node_id).spec.child
        assert call is not None
        lease, state, effects, created = self._open_child(node_id, attempt_id, child_run_id, create)
        try:
            driver = RunDriver(
                # A child never detaches on its own account: it parks only when its parent would.
                detach_on_wait=self.detach_on_wait,
                observer=self.observer,
                journal=self.journal,
                registry=self.registry,
                ids=self.ids,
                state=state,
                lease=lease,
                concurrent=self.concurrent,
                snapshot_every=self.snapshot_every,
                lease_ttl_ms=self.lease_ttl_ms,
                leases=self.leases,
                owner=self.owner,
                drivers=self.drivers,
                outer=self,
                # A run just created starts at virtual time 0, at the wall time recorded as its epoch.
                wall_ms=state.epoch_ms if created else None,
            )
            self._child_drivers[child_run_id] = (node_id, driver)
            if self.drivers is not None:
                self.drivers[child_run_id] = driver
            pending = self._pending_child_cancels.pop(child_run_id, None)
            if pending is not None:
                driver.request_cancel(*pending)
            try:
                final = driver.drive(effects)
            finally:
                del self._child_drivers[child_run_id]
                if self.drivers is not None:
                    self.drivers.pop(child_run_id, None)
        finally:
            if lease is not None:
                lease.release()
        if final.status.is_terminal:
            return ChildReport(final, child_completion(final, call.outputs), {})
        return ChildReport(final, None, driver.waits())

    def _open_child(
        self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None
    ) -> tuple[RecoveryLeaseGuard | None, RunState, tuple[RecoveryEffect, ...], bool]:
        """The child run's lease, state and recovery effects, and whether it was created (not resumed)."""
        if create is None:
            try:
                lease, state, effects = self._resume_child(child_run_id)
            except RunNotFound:
                # The parent stopped after ChildStarted but before the child's RunCreated.
                create = self._recorded_create(child_run_id)
            else:
                link = state.parent
                if link is None or (link.run_id, link.node_id, link.attempt_id) != (
                    self.state.run_id,
                    node_id,
                    attempt_id,
                ):
                    if lease is not None:
                        lease.release()
                    raise CorruptionError(
                        f"run {child_run_id} is not the child of run {self.state.run_id} node {node_id!r} "
                        f"attempt {attempt_id} (its parent link is {link}); inspect both runs"
                    )
                return lease, state, effects, False
        # The child's virtual time counts from its own creation, in wall time like every run's.
        create = msgspec.structs.replace(create, epoch_ms=self.hub.clock.wall_ms())
        lease = (
            None if self.leases is None else self.leases.acquire(child_run_id, self.owner, self.lease_ttl_ms)
        )
        try:
            commit = commit_command(
                self.journal, None, create, ids=self.ids, fence=None if lease is None else lease.fencing_token
            )
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if self.observer is not None:
            self.observer(commit.state, commit.events)
        return lease, commit.state, (), True

    def _resume_child(
        self, child_run_id: str
    ) -> tuple[RecoveryLeaseGuard | None, RunState, tuple[RecoveryEffect, ...]]:
        if self.leases is None:
            state = inspect_run(self.journal, child_run_id).state
            check_unfinished_handlers(state, self.registry.is_available)
            return None, state, recovery_effects(state)
        session = resume_run(
            self.journal,
            self.leases,
            child_run_id,
            owner=self.owner,
            ttl_ms=self.lease_ttl_ms,
            handler_available=self.registry.is_available,
        )
        return session.lease, session.state, session.effects

    def _recorded_create(self, child_run_id: str) -> CreateRun:
        """The child's ``CreateRun`` from the parent's recorded ChildStarted (with the input as recorded)."""
        run_id = self.state.run_id
        after = 0
        while True:
            records = self.journal.read(run_id, after=after, limit=1024)
            if not records:
                break
            for record in records:
                if record.event_type != "ChildStarted":
                    continue
                event = decode_event(record.event_type, record.schema_version, record.payload)
                if isinstance(event, ChildStarted) and event.child_run_id == child_run_id:
                    return child_create_run(self.state, event)
            after = records[-1].sequence
        raise CorruptionError(
            f"run {run_id} records no ChildStarted for child run {child_run_id}, yet its state names it; "
            f"inspect the run with `mayfly inspect {run_id}`"
        )

    def _child_finished(self, attempt_id: str, task: Task[_Work]) -> None:
        try:
            report = task.result()
        except TaskCancelled:
            self._children.pop(attempt_id, None)  # the hub is shutting down
            return
        except TaskFailed as failed:
            # A child run that cannot be driven (journal or lease trouble) stops its parent too.
            cause = failed.__cause__
            raise (cause if isinstance(cause, Exception) else failed) from None
        assert isinstance(report, ChildReport)
        self._child_done(attempt_id, report)

    def _child_done(self, attempt_id: str, report: ChildReport) -> None:
        """Commit a terminal child's result on the parent attempt, or remember the waits it parked on."""
        node_id, child_run_id = self._children.pop(attempt_id)
        if self.state.status.is_terminal or self._node(node_id).attempt_id != attempt_id:
            self.rejected_results += 1  # the run closed the attempt (and cancelled the child) meanwhile
            if report.completion is None:
                self._cancel_stopped_child(node_id, child_run_id)  # it parked before the cancel reached it
            return
        if report.completion is None:
            self._parked_children[attempt_id] = (node_id, child_run_id, report.waiting)
            return
        self.advance_time()  # the parent's outcome, and any retry delay, count from now
        if self._node(node_id).attempt_id != attempt_id:
            self.rejected_results += 1
            return
        result = self.commit(report.completion)
        if isinstance(result, Rejection):
            if result.code in (RejectionCode.ATTEMPT_NOT_ACTIVE, RejectionCode.RUN_TERMINAL):
                self.rejected_results += 1
                return
            raise CommandRejected(result, f"result of child run {child_run_id} rejected: {result}")

    def _cancel_closed_children(self, events: tuple[HistoryEvent, ...]) -> None:
        """Cancel the child runs of child-call attempts the run just closed (or all, once it is terminal)."""
        completed = {e.attempt_id for e in events if isinstance(e, ChildCompleted)}
        run_id = self.state.run_id
        for event in events:
            if isinstance(event, CancellationRequested):
                why = f"parent run {run_id} cancelled: {event.reason}"
                for target in event.targets:
                    if target.child_run_id is not None:
                        self._cancel_child(target.node_id, target.attempt_id, target.child_run_id, why)
            elif (
                isinstance(event, NodeOutcomeCommitted)
                and event.attempt_id is not None
                and event.attempt_id not in completed
            ):
                child = self._child_of(event.attempt_id)
                if child is not None:
                    detail = getattr(event.outcome, "reason", "")
                    why = f"parent attempt closed: {event.outcome.kind.value} ({detail})"
                    self._cancel_child(child[0], event.attempt_id, child[1], why)
        if self.state.status.is_terminal:
            for attempt_id in [*self._children, *self._parked_children]:
                child = self._child_of(attempt_id)
                assert child is not None
                self._cancel_child(child[0], attempt_id, child[1], f"parent run {run_id} ended")

    def _child_of(self, attempt_id: str) -> tuple[str, str] | None:
        child = self._children.get(attempt_id)
        if child is not None:
            return child
        parked = self._parked_children.get(attempt_id)
        return None if parked is None else (parked[0], parked[1])

    def _cancel_child(self, node_id: str, attempt_id: str, child_run_id: str, reason: str) -> None:
        """Cancel child run ``child_run_id`` once, naming this run's node as the requester."""
        self._parked_children.pop(attempt_id, None)
        if child_run_id in self._cancelled_children:
            return
        self._cancelled_children.add(child_run_id)
        requester, reason = self._child_requester(node_id), _bounded(reason)
        live = self._child_drivers.get(child_run_id)
        if live is not None:
            live[1].request_cancel(requester, reason)
        elif attempt_id in self._tasks:
            self._pending_child_cancels[child_run_id] = (requester, reason)  # its task has not opened it yet
        else:  # parked, or left behind by an earlier process: cancel it through its journal
            self._cascade_cancel(child_run_id, requester, reason)

    def _cascade_cancel(self, child_run_id: str, requester: str, reason: str) -> None:
        """Cancel a child run (and its descendants) through the journal, under this driver's identity."""
        cancel_run_cascade(
            self.journal,
            self.leases,
            child_run_id,
            requester=requester,
            reason=reason,
            owner=self.owner,
            ids=self.ids,
            ttl_ms=self.lease_ttl_ms,
            observer=self.observer,
        )

    def _join_children(self) -> None:
        """Once the run is terminal, wait for the child runs still being driven (being cancelled).

        A child whose driver had already stopped short of its end (parked on a
        signal) when the cancellation came is cancelled through its journal,
        so no child run outlives its parent.
        """
        if not self.state.status.is_terminal:
            return
        for attempt_id, task in list(self._tasks.items()):
            child = self._children.get(attempt_id)
            if child is None:
                continue
            try:
                report = task.join()
            except TaskCancelled:
                continue  # the hub is shutting down
            except TaskFailed as failed:
                cause = failed.__cause__
                raise (cause if isinstance(cause, Exception) else failed) from None
            del self._tasks[attempt_id]
            assert isinstance(report, ChildReport)
            if not report.state.status.is_terminal:
                self._cancel_stopped_child(*child)

    def _cancel_stopped_child(self, node_id: str, child_run_id: str) -> None:
        """Cancel, through its journal, a child run whose driver stopped before a cancellation reached it."""
        requester, reason = self._pending_child_cancels.pop(
            child_run_id, (self._child_requester(node_id), f"parent run {self.state.run_id} ended")
        )
        self._cancelled_children.add(child_run_id)
        self._cascade_cancel(child_run_id, requester, reason)

    def _cancel_recorded_children(self) -> None:
        """For a run that is already cancelled: cancel the child runs its cancellation named, if still open.

        A process that cancelled the run without cascading (``mayfly cancel``)
        leaves them running; resuming the parent finishes the cascade.
        """
        cancellation = self.state.cancellation
        if cancellation is None:
            return
        for target in cancellation.targets:
            if target.child_run_id is not None:
                self._cancelled_children.add(target.child_run_id)
                self._cascade_cancel(
                    target.child_run_id,
                    self._child_requester(target.node_id),
                    _bounded(f"parent run {self.state.run_id} cancelled: {cancellation.reason}"),
                )

    def waits(self) -> dict[str, str]:
        """The durable waits this run is parked on, its own and ``node/child-node`` for parked children."""
        waiting = {
            node.node_id: node.wait.name for node in self.state.waiting_nodes() if node.wait is not None
        }
        for node_id, _, child_waits in self._parked_children.values():
            for path, name in child_waits.items():
                waiting[f"{node_id}/{path}"] = name
        return waiting

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

        def attempt() -> _Work:
            return invoke_handler(entry, holder["request"])

        task: Task[_Work] = self.hub.spawn(attempt, name=name, notify=self._done)
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
            waiting = bool(self.state.waiting_nodes()) or bool(self._parked_children)
            if waiting and self.detach_on_wait and self._next_deadline(waits=False) is None:
                return False
            if not waiting and self._next_deadline() is None:
                raise RuntimeError(
                    f"run {self.state.run_id} cannot make progress: nothing ready, running or scheduled"
                )
        deadline = self._next_deadline()
        renew_at = self._renewed_at + self.lease_ttl_ms // 3 if self.lease is not None else None
        wake_at = min(
            [t for t in (None if deadline is None else self._origin + deadline, renew_at) if t is not None],
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
        try:
            if not self.state.status.is_terminal and self._due():
                self.advance_time()  # a signal that comes after the wait's deadline finds it expired
            result = self.commit(
                DeliverSignal(
                    node_id=request.node_id,
                    signal_id=request.signal_id,
                    token=request.token,
                    decision=request.decision,
                    name=request.name,
                )
            )
        except BaseException as exc:
            request.error = exc  # the sender sees the journal's error; the driver stops with it too
            request.done.set()
            raise
        request.result = result if isinstance(result, Rejection) else result.events
        request.done.set()

    def _renew_if_due(self) -> None:
        if self.outer is not None and not self.concurrent:
            self.outer._renew_if_due()  # an inline child blocks its parent's loop: renew for it
        if self.lease is None:
            return
        now = self.hub.now_ms()
        if now - self._renewed_at >= self.lease_ttl_ms // 3:
            self.lease.renew(self.lease_ttl_ms)
            self._renewed_at = now

    def _finished(self, task: Task[_Work]) -> None:
        node_id, attempt_id = self._task_attempt.pop(task)
        self._tasks.pop(attempt_id, None)
        if attempt_id in self._children:
            self._child_finished(attempt_id, task)
            return
        try:
            result = task.result()
        except TaskCancelled:
            return  # the run closed this attempt; its outcome is already committed
        except TaskFailed as failed:
            if not isinstance(failed.__cause__, Exception):
                # KeyboardInterrupt or SystemExit stops the process, not the attempt: the hub
                # re-raises it, and the attempt stays in flight for resume to re-invoke.
                return
            result = failure_outcome(failed)
        assert not isinstance(result, ChildReport)
        self._complete(self.state.index[node_id], attempt_id, result)

    def _complete(self, index: int, attempt_id: str, outcome: HandlerResult) -> None:
        node = self.state.node(index)
        if node.attempt_id != attempt_id:
            self.rejected_results += 1
            return
        # A retry's delay is added to the time its outcome is committed; and a result seen after a
        # deadline passed (the hub was busy, or the timer and the result were ready together)
        # loses to that deadline, so the attempt it belonged to may be closed by now.
        if isinstance(outcome, RetryableFailure | PermanentFailure) or self._due():
            self.advance_time()
            if self.state.node(index).attempt_id != attempt_id:
                self.rejected_results += 1
                return
        if isinstance(outcome, WaitForSignal):
            self._open_wait(index, attempt_id, outcome)
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
            for attempt_id, task in self._tasks.items():
                # A child run's task is not killed: its run is cancelled through its journal below.
                if attempt_id not in self._children and not task.done:
                    task.cancel("run completed")
        else:
            for event in events:
                if isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                    closed = self._tasks.get(event.attempt_id)
                    if closed is not None and not closed.done and event.attempt_id not in self._children:
                        closed.cancel(f"attempt closed: {event.outcome.kind.value}")
        if self._children or self._parked_children:
            self._cancel_closed_children(events)


_WAKE: Any = object()

Observer = Callable[[RunState, tuple[HistoryEvent, ...]], None]
"""Called after every commit with the new state and the committed events (progress, timelines)."""


class SignalRequest:
    """A signal delivery queued for the driver by another task, and its result once processed."""

    __slots__ = ("decision", "done", "error", "name", "node_id", "result", "signal_id", "token")

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
        self.error: BaseException | None = None
        """Set instead of ``result`` when the delivery could not be recorded (raised to the sender)."""


def cancel_run_cascade(
    journal: WorkflowJournal,
    leases: RecoveryLeaseStore | None,
    run_id: str,
    *,
    requester: str,
    reason: str,
    owner: str,
    ids: IdSource,
    ttl_ms: int = 30_000,
    observer: Observer | None = None,
) -> None:
    """Cancel run ``run_id`` through its journal, then in turn every child run its cancellation targets.

    For runs no live driver is driving (a parked child, a run left behind by
    an earlier process, or a root cancelled from a command line). A run that
    was never created, or is already terminal, is left as it is. Each run is
    leased while it is cancelled; ``LeaseHeld`` means another process drives
    it and must cancel it. Child runs name their parent (``"parent
    <run>/<node>"``) as requester.
    """
    pending = [(run_id, requester, reason)]
    while pending:
        run, who, why = pending.pop()
        lease = None if leases is None else leases.acquire(run, owner, ttl_ms)
        try:
            try:
                state = inspect_run(journal, run).state
            except RunNotFound:
                continue
            if state.status.is_terminal:
                continue
            commit = commit_command(
                journal,
                state,
                CancelRun(who, why),
                ids=ids,
                fence=None if lease is None else lease.fencing_token,
            )
        finally:
            if lease is not None:
                lease.release()
        if observer is not None:
            observer(commit.state, commit.events)
        for event in commit.events:
            if isinstance(event, CancellationRequested):
                for target in event.targets:
                    if target.child_run_id is not None:
                        nested = _bounded(f"parent run {run} cancelled: {why}")
                        pending.append((target.child_run_id, f"parent {run}/{target.node_id}", nested))
