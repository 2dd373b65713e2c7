"""The run loop: turns one run's committed state into handler invocations and their results into commands.

One :class:`RunDriver` owns one run inside a hub task, and holds everything
about it that changes while it is driven (state, lease, tasks, queued
requests); what it shares with every other run is its
:class:`~mayfly.runtime._context.DriveContext`. It follows the ADR's loop —
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

How a handler is called and what its failure becomes is
:mod:`mayfly.runtime._invoke`; child calls are driven, reported and cancelled
by the run's :class:`~mayfly.runtime._children.ChildSupervisor`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mayfly.commit import Commit, commit_command
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
from mayfly.model.errors import CommandRejected, LeaseLost, MayflyError, TaskCancelled
from mayfly.model.events import ChildStarted, Event, NodeOutcomeCommitted, NodeStarted, SignalAccepted
from mayfly.model.outcomes import PermanentFailure, RetryableFailure
from mayfly.model.signals import SignalToken
from mayfly.model.state import NodeState, RunState
from mayfly.recovery import ReconcileAttempt, ReconcileChild, RecoveryEffect
from mayfly.runtime._children import ChildReport, ChildSupervisor, cancel_run_cascade
from mayfly.runtime._context import DriveContext
from mayfly.runtime._invoke import (
    HandlerResult,
    attempt_result,
    handler_request,
    invoke_handler,
    invoke_inline,
)
from mayfly.runtime._time import PICKUP_LAG_MS, next_deadline, run_time_at
from mayfly.runtime._time import catch_up as catch_up_to
from mayfly.runtime.request import HandlerRequest
from mayfly.runtime.signals import WaitForSignal
from mayfly.snapshot import make_snapshot
from mayfly.substrate import Channel, Task, WaitTimeout, current_hub, current_task, sleep
from mayfly.substrate import Event as HubEvent

__all__ = ["RunDriver", "SignalRequest", "cancel_run_cascade"]

_Work = HandlerResult | ChildReport

_CONFIRM_TRIES = 3
"""Renewals tried before a handler starts on a lease whose renewals keep coming back late."""

FINAL_SNAPSHOT_RECORDS = 100
"""A run that ends writes a last snapshot only if at least this many records (or ``snapshot_every``,
if fewer) followed its previous one: a short tail replays in well under a millisecond, while a
snapshot costs a file or row write of its own (two disk flushes on a durable file store), which
for short runs was a large share of everything they wrote."""


class RunDriver:
    """Drives one run to its terminal result inside the current hub task.

    ``context`` is what the run shares with every other run driven with it.
    ``lease`` is the run's own (``None``: driven without one);
    ``concurrent`` chooses the standalone mode (a task per attempt) over the
    current-task mode (attempts run inline, serially); ``detach_on_wait``
    returns once the run can only progress through a signal. ``drivers`` is
    the table of live drivers by run id, so signals and cancellations
    addressed to a child run reach its nested driver; ``outer`` is the
    driver of the run that called this one as a child. ``wall_ms`` is the
    wall-clock reading the run's virtual time is synchronised with (the hub
    clock's, read now, by default): a creator passes the reading it recorded
    as the run's epoch. ``detach_after_ms`` (a worker's mode) also detaches a
    run that has nothing to do for longer than that: a retry backoff or a
    deadline further away, so its slot is freed and the run index wakes it.
    ``lease_asked_ms`` is the hub time at which the lease's grant was asked
    for (now, by default): the lease is known to be held until that time
    plus the TTL, and no handler starts once that point is near without a
    renewal first (see :meth:`_confirm_lease`).
    """

    def __init__(
        self,
        context: DriveContext,
        state: RunState,
        *,
        lease: RecoveryLeaseGuard | None,
        concurrent: bool,
        detach_on_wait: bool = False,
        drivers: dict[str, RunDriver] | None = None,
        outer: RunDriver | None = None,
        wall_ms: int | None = None,
        detach_after_ms: int | None = None,
        lease_asked_ms: int | None = None,
    ) -> None:
        self.context = context
        self.state = state
        self.lease = lease
        self.concurrent = concurrent
        self.detach_on_wait = detach_on_wait
        self.detach_after_ms = detach_after_ms
        self.draining = False
        self.drivers = drivers
        self.outer = outer
        self.hub = current_hub()
        # The hub time at which the run's virtual time is 0. Virtual time is the wall time since the
        # run's epoch (never less than the recorded time), and from here on follows the hub's monotonic
        # clock, so a wall-clock jump while this driver runs moves no deadline.
        wall = self.hub.clock.wall_ms() if wall_ms is None else wall_ms
        self._origin = self.hub.now_ms() - run_time_at(state, wall)
        self._renewed_at = self.hub.now_ms()
        # Until when the lease is surely held, on the hub's clock: the time its grant or last
        # renewal was asked for, plus the TTL (the store counts the TTL from a later moment).
        asked = self._renewed_at if lease_asked_ms is None else lease_asked_ms
        self._held_until = asked + context.lease_ttl_ms
        self._renewing: HubEvent | None = None
        self._keeper: Task[None] | None = None
        self._lease_error: Exception | None = None
        self._since_snapshot = 0
        self._done: Channel[Task[_Work]] = Channel()
        self._tasks: dict[str, Task[_Work]] = {}
        self._task_attempt: dict[Task[_Work], tuple[str, str]] = {}
        self._cancel_requests: list[tuple[str, str]] = []
        self._signal_requests: list[SignalRequest] = []
        self._accepted: dict[str, int] = {}
        self.children = ChildSupervisor(self)
        self.rejected_results = 0
        self._timed_nodes = [
            i for i, node in enumerate(state.spec.nodes) if node.retry.attempt_deadline_ms is not None
        ]
        self._deadline_key: tuple[int, bool] | None = None
        self._deadline: int | None = None

    def nested(self, state: RunState, lease: RecoveryLeaseGuard | None, *, wall_ms: int | None) -> RunDriver:
        """A driver for a child run of this run: the same context, mode and table of live drivers."""
        return RunDriver(
            self.context,
            state,
            lease=lease,
            concurrent=self.concurrent,
            # A child never detaches on its own account: it parks only when its parent would.
            detach_on_wait=self.detach_on_wait,
            drivers=self.drivers,
            outer=self,
            wall_ms=wall_ms,
            detach_after_ms=self.detach_after_ms,
        )

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
        context = self.context
        try:
            result = commit_command(context.journal, self.state, command, ids=context.ids, fence=self.fence)
        except CommandRejected as rejected:
            assert isinstance(rejected.rejection, Rejection)
            return rejected.rejection
        self.state = result.state
        if result.events:
            context.observe(self.state, result.events)
        if result.records:
            self._since_snapshot += len(result.records)
            since = self._since_snapshot
            if since >= context.snapshot_every or (
                self.state.status.is_terminal and since >= min(context.snapshot_every, FINAL_SNAPSHOT_RECORDS)
            ):
                context.journal.write_snapshot(
                    self.state.run_id, make_snapshot(self.state, result.records[-1])
                )
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
            self.state,
            self.run_now(),
            lambda _, command: commit(command).state,
            timed=self._timed_nodes,
            lag_ms=PICKUP_LAG_MS,
        )

    def request_cancel(self, requester: str, reason: str) -> None:
        """Ask the driver to cancel the run at its next step (from another task on the same hub)."""
        self._cancel_requests.append((requester, reason))
        # Wake the driver if it is waiting for handler results.
        self._done.send(_WAKE)
        if not self.concurrent:
            # Current-task mode drives a child inline, so this driver only sees the request once
            # the child ends: cancel the child now, naming this run, and let the cascade follow.
            self.children.cancel_inline(reason)

    def request_drain(self) -> None:
        """Start no new attempt; detach once the attempts in flight have finished (a stopping worker)."""
        self.draining = True
        self._done.send(_WAKE)

    def request_signal(self, request: SignalRequest) -> None:
        """Queue a signal delivery for the driver (from another task); ``request.done`` is set after."""
        self._signal_requests.append(request)
        self._done.send(_WAKE)

    @property
    def cancel_requested(self) -> bool:
        """Whether a cancellation is queued that the loop has not committed yet."""
        return bool(self._cancel_requests)

    def is_active(self, node_id: str, attempt_id: str) -> bool:
        """Whether ``attempt_id`` is still node ``node_id``'s open attempt."""
        return self._node(node_id).attempt_id == attempt_id

    # -- tasks ----------------------------------------------------------------------

    def spawn_attempt(
        self, work: Callable[[], _Work], *, name: str, node_id: str, attempt_id: str
    ) -> Task[_Work]:
        """Run ``work`` for attempt ``attempt_id`` in a task of its own, which the loop waits for."""
        task: Task[_Work] = self.hub.spawn(work, name=name, notify=self._done)
        self._tasks[attempt_id] = task
        self._task_attempt[task] = (node_id, attempt_id)
        return task

    def task(self, attempt_id: str) -> Task[_Work] | None:
        """The task running attempt ``attempt_id``, if one is."""
        return self._tasks.get(attempt_id)

    def forget_task(self, attempt_id: str) -> None:
        """Stop waiting for the task of ``attempt_id`` (it was joined)."""
        del self._tasks[attempt_id]

    # -- the loop -----------------------------------------------------------------

    def drive(self, effects: tuple[RecoveryEffect, ...] = ()) -> RunState:
        """Run until the terminal result is committed and return the final state.

        A driver holding a lease in the standalone mode renews it from a
        keeper task, so waiting for handlers needs no timer of its own.
        """
        keeper = None
        if self.lease is not None and self.concurrent:
            keeper = self.hub.spawn(self._keep_lease, name=f"lease keeper of {self.state.run_id}")
        self._keeper = keeper
        try:
            self._drive(effects)
        except BaseException as exc:
            self._abandon_signal_requests(exc)
            # Nothing more is written for this run by this driver (its lease may be lost): its
            # in-flight attempts stay in flight in the journal, for the next owner to reconcile.
            for task in self._tasks.values():
                if not task.done:
                    task.cancel(f"driver of run {self.state.run_id} stopped: {type(exc).__name__}")
            raise
        finally:
            if keeper is not None:
                keeper.cancel("the driver stopped")
                self._keeper = None
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
            self.children.cancel_recorded()
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
                self.children.reconcile(effect)
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
            if not self.draining:
                ready = self.state.ready_nodes()
                if ready:
                    self._start(ready)
                    continue
                if self._resume_accepted():
                    continue
            if not self._wait():
                break  # parked on a signal: detached
        self._cancel_closed_attempts(())
        self.children.join()
        return self.state

    def _due(self) -> bool:
        deadline = self._next_deadline()
        return deadline is not None and deadline <= self.run_now()

    def _next_deadline(self, *, waits: bool = True) -> int | None:
        """The earliest virtual time something is due (see :func:`mayfly.runtime._time.next_deadline`).

        ``waits=False`` leaves out deadlines that must not keep a detaching
        driver from returning; resume restores them from the history. The
        answer is a function of the state, which changes only by committed
        records: it is kept until the run's sequence moves.
        """
        key = (self.state.sequence, waits)
        if self._deadline_key != key:
            self._deadline = next_deadline(self.state, waits=waits, timed=self._timed_nodes)
            self._deadline_key = key
        return self._deadline

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
                self.context.ids.new_id(),
                child_run_id=self.context.ids.new_id() if self._node(node_id).spec.child else None,
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
            self.children.start(started)
        elif self.concurrent:
            self._launch(index, attempt_id)
        else:
            self._run_inline(index, attempt_id)

    def _run_inline(self, index: int, attempt_id: str) -> None:
        self._confirm_lease()
        entry, request = handler_request(
            self.state, index, attempt_id, current_task().cancellation, self.context.registry
        )
        # This task is busy in the handler, so another one keeps the lease alive meanwhile.
        keeper = self.hub.spawn(self._keep_lease, name=f"lease keeper of {self.state.run_id}")
        try:
            result = invoke_inline(entry, request)
        finally:
            keeper.cancel("inline handler returned")
        self._complete(index, attempt_id, result)

    def _keep_lease(self) -> None:
        """Renew the lease (and inline parents' leases) every third of the TTL while the run is driven.

        A failed renewal (the lease was lost, its store is unreachable) is
        handed to the driver, which stops with it at its next step; the
        keeper wakes it for that.
        """
        while True:
            sleep(self.context.lease_ttl_ms / 3 / 1000)
            try:
                self._renew_if_due()
            except TaskCancelled:
                return
            except Exception as error:  # the driver raises it
                self._lease_error = error
                self._done.send(_WAKE)
                return

    def _node(self, node_id: str) -> NodeState:
        node = self.state.node_by_id(node_id)
        assert node is not None, node_id
        return node

    def waits(self) -> dict[str, str]:
        """The durable waits this run is parked on, its own and ``node/child-node`` for parked children."""
        waiting = {
            node.node_id: node.wait.name for node in self.state.waiting_nodes() if node.wait is not None
        }
        waiting.update(self.children.waits())
        return waiting

    def _launch(self, index: int, attempt_id: str) -> None:
        self._confirm_lease()
        node = self.state.node(index)
        # Named for the handler too, so a hub diagnostic (a cooperative handler hogging it) says whose.
        name = f"{node.node_id}#{node.attempt} handler {node.spec.handler}"
        # The task's own cancellation handle is the one the handler sees.
        holder: dict[str, HandlerRequest] = {}

        def attempt() -> _Work:
            return invoke_handler(entry, holder["request"])

        task = self.spawn_attempt(attempt, name=name, node_id=node.node_id, attempt_id=attempt_id)
        entry, request = handler_request(
            self.state, index, attempt_id, task.cancellation, self.context.registry
        )
        holder["request"] = request

    def _wait(self) -> bool:
        """Park until a handler finishes, a request arrives or something falls due.

        Returns False when the run can only progress through an external
        signal and this driver detaches (``detach_on_wait``): the run stays
        durably parked for whoever delivers the signal and resumes it.
        """
        if not self._tasks:
            if self.draining:
                return False  # stopping: what is left is the next owner's
            waiting = bool(self.state.waiting_nodes()) or self.children.parked
            if waiting and self.detach_on_wait and self._next_deadline(waits=False) is None:
                return False
            if self.detach_after_ms is not None and not self._accepted:
                deadline = self._next_deadline()
                if (waiting or deadline is not None) and (
                    deadline is None or deadline - self.run_now() > self.detach_after_ms
                ):
                    return False
            if not waiting and self._next_deadline() is None:
                raise RuntimeError(
                    f"run {self.state.run_id} cannot make progress: nothing ready, running or scheduled"
                )
        deadline = self._next_deadline()
        renew_at = (
            self._renewed_at + self.context.lease_ttl_ms // 3
            if self.lease is not None and self._keeper is None
            else None
        )
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
        if self._lease_error is not None:
            raise self._lease_error  # the keeper's renewal failed
        if self.outer is not None and not self.concurrent:
            self.outer._renew_if_due()  # an inline child blocks its parent's loop: renew for it
        if self.lease is None:
            return
        if self.hub.now_ms() - self._renewed_at >= self.context.lease_ttl_ms // 3:
            self._renew()

    def _renew(self) -> None:
        """Renew the lease now; a renewal already under way is waited for instead of doubled.

        A failed renewal is kept: the driver stops with it (here, or at its
        next step when the keeper's renewal failed).
        """
        assert self.lease is not None
        if self._renewing is not None:
            self._renewing.wait()
        else:
            asked = self._renewed_at = self.hub.now_ms()  # first: the keeper and the loop never renew at once
            ttl_ms = self.context.lease_ttl_ms
            renewing = self._renewing = HubEvent()
            try:
                self.lease.renew(ttl_ms)
                self._held_until = max(self._held_until, asked + ttl_ms)
            except TaskCancelled:
                raise  # the renewing task was stopped, not the lease: a waiter renews itself
            except Exception as error:
                self._lease_error = error
            finally:
                self._renewing = None
                renewing.set()
        if self._lease_error is not None:
            raise self._lease_error

    def _confirm_lease(self) -> None:
        """Before a handler starts: renew first if the lease may lapse within half its TTL.

        A commit under the lease's fencing token proves nobody took the run
        over before it committed, not that the lease is still held when its
        answer arrives. An answer held up longer than the TTL (a network
        partition, a stalled process) may find the lease expired and the run
        taken over: the new owner may have run the attempt to success meanwhile,
        and starting it here again would repeat its effects. So a handler starts
        only while the lease is surely held for a while yet, on this process's
        monotonic clock; otherwise a renewal confirms it first, or the driver
        stops with ``LeaseLost`` (the run is the new owner's).
        """
        if self.lease is None:
            return
        margin = self.context.lease_ttl_ms // 2
        for _ in range(_CONFIRM_TRIES):
            if self.hub.now_ms() < self._held_until - margin:
                return
            self._renew()
        raise LeaseLost(
            f"recovery lease of run {self.state.run_id} could not be confirmed before starting a handler: "
            f"{_CONFIRM_TRIES} renewals each took more than half the lease TTL "
            f"({self.context.lease_ttl_ms} ms); the run is left to whichever worker holds it next"
        )

    def _finished(self, task: Task[_Work]) -> None:
        node_id, attempt_id = self._task_attempt.pop(task)
        self._tasks.pop(attempt_id, None)
        if self.children.owns(attempt_id):
            self.children.finished(attempt_id, task)
            return
        result = attempt_result(task)
        if result is None:
            return  # cancelled (its outcome is already committed), or stopped with the process
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
        # One commit per node: the dependents this outcome makes ready are started in the same batch,
        # under ids offered here (see CompleteAttempt.start_next). Not while a cancel or a signal
        # waits to be recorded first, nor while draining, nor in current-task mode (which runs each
        # started handler inline, in order, from the loop).
        offered: tuple[str, ...] = ()
        if self.concurrent and not (self.draining or self._cancel_requests or self._signal_requests):
            new_id = self.context.ids.new_id
            offered = tuple(new_id() for _ in range(max(1, len(node.dependents))))
        result = self.commit(CompleteAttempt(node.node_id, attempt_id, outcome, offered))
        if isinstance(result, Rejection):
            if result.code in (RejectionCode.ATTEMPT_NOT_ACTIVE, RejectionCode.RUN_TERMINAL):
                self.rejected_results += 1  # a late result for an attempt the run already closed
                return
            raise CommandRejected(result, f"result of attempt {attempt_id} rejected: {result}")
        if offered:
            for event in result.events:
                if isinstance(event, NodeStarted) and event.attempt_id in offered:
                    started = self.state.index[event.node_id]
                    if self.state.node(started).attempt_id == event.attempt_id:
                        self._launch(started, event.attempt_id)

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

    def _cancel_closed_attempts(self, events: tuple[Event, ...]) -> None:
        """Cancel the tasks of attempts the run just closed itself (cancellation, deadline, budget)."""
        if self.state.status.is_terminal:
            for attempt_id, task in self._tasks.items():
                # A child run's task is not killed: its run is cancelled through its journal below.
                if not self.children.owns(attempt_id) and not task.done:
                    task.cancel("run completed")
        else:
            for event in events:
                if isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                    closed = self._tasks.get(event.attempt_id)
                    if closed is not None and not closed.done and not self.children.owns(event.attempt_id):
                        closed.cancel(f"attempt closed: {event.outcome.kind.value}")
        if self.children.active:
            self.children.cancel_closed(events)


_WAKE: Any = object()


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
        self.done = HubEvent()
        self.result: Any = None
        self.error: BaseException | None = None
        """Set instead of ``result`` when the delivery could not be recorded (raised to the sender)."""
