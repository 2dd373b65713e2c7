"""The child-run supervisor: the child runs of one run's child-call attempts, driven, reported and cancelled.

Once ``ChildStarted`` is committed, the supervisor creates the child run
(under its own recovery lease, held by the same owner) and drives it with a
nested driver, in a task of its own (concurrent mode) or inline (current-task
mode); the child's terminal result is committed on the parent with
``CompleteChild``. When the parent closes a child-call attempt (cancellation,
deadline, budget) the child run is cancelled in turn through its own journal,
naming the parent as requester, which cascades to its own children. A child
parked on a signal never detaches by itself: it reports its waits, and the
parent detaches with them (see :meth:`ChildSupervisor.waits`); resuming the
parent resumes the child.

:func:`cancel_run_cascade` is the same cancellation for runs no live driver
drives: a parked child, a run left behind by an earlier process, or a root
cancelled from a command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec.structs

from mayfly.commit import commit_command
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard, RecoveryLeaseStore
from mayfly.model.commands import CancelRun, CompleteChild, CreateRun, Rejection, RejectionCode
from mayfly.model.errors import CommandRejected, CorruptionError, RunNotFound, TaskCancelled, TaskFailed
from mayfly.model.events import (
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    Event,
    NodeOutcomeCommitted,
)
from mayfly.model.ids import IdSource
from mayfly.model.state import RunState
from mayfly.recovery import (
    ReconcileChild,
    RecoveryEffect,
    check_unfinished_handlers,
    inspect_run,
    recovery_effects,
    resume_run,
)
from mayfly.reducer import Upcaster, decode_event
from mayfly.reducer.children import child_completion, child_create_run
from mayfly.runtime._context import Observer, notify_recovery
from mayfly.runtime._invoke import bounded_reason
from mayfly.substrate import Task

if TYPE_CHECKING:
    from mayfly.runtime._driver import RunDriver

__all__ = ["ChildReport", "ChildSupervisor", "cancel_run_cascade"]


class ChildReport:
    """What driving a child run came to: its final state and either the parent's completion or its waits."""

    __slots__ = ("completion", "state", "waiting")

    def __init__(self, state: RunState, completion: CompleteChild | None, waiting: dict[str, str]) -> None:
        self.state = state
        self.completion = completion
        """The parent's ``CompleteChild`` once the child is terminal; ``None`` while it is parked."""
        self.waiting = waiting
        """The parked child's waits (``node`` or ``node/child-node`` -> signal name)."""


class ChildSupervisor:
    """The child runs of one driver's child-call attempts: it drives them and answers for them to the run.

    It reads and commits through its driver (``run``), whose task table holds
    the tasks of children driven concurrently.
    """

    __slots__ = ("_cancelled", "_children", "_drivers", "_parked", "_pending_cancels", "_run")

    def __init__(self, run: RunDriver) -> None:
        self._run = run
        # Child calls, by parent attempt id: started or reconciled and not yet reported ...
        self._children: dict[str, tuple[str, str]] = {}
        # ... and parked on a signal, with the waits they reported.
        self._parked: dict[str, tuple[str, str, dict[str, str]]] = {}
        # Nested drivers now driving a child run (child run id -> parent node, driver).
        self._drivers: dict[str, tuple[str, RunDriver]] = {}
        # Cancellations for child runs whose driver does not exist yet, and those already requested.
        self._pending_cancels: dict[str, tuple[str, str]] = {}
        self._cancelled: set[str] = set()

    # -- what the run asks ----------------------------------------------------------

    def owns(self, attempt_id: str) -> bool:
        """Whether ``attempt_id`` is a child call being driven (its task is not a handler's)."""
        return attempt_id in self._children

    @property
    def active(self) -> bool:
        """Whether any child run is being driven or is parked."""
        return bool(self._children or self._parked)

    @property
    def parked(self) -> bool:
        """Whether any child run is parked on a signal."""
        return bool(self._parked)

    def parked_runs(self) -> list[str]:
        """The run ids of the parked child runs."""
        return [child_run_id for _, child_run_id, _ in self._parked.values()]

    def waits(self) -> dict[str, str]:
        """The parked children's waits, as ``node/child-node`` -> signal name."""
        waiting: dict[str, str] = {}
        for node_id, _, child_waits in self._parked.values():
            for path, name in child_waits.items():
                waiting[f"{node_id}/{path}"] = name
        return waiting

    # -- starting and reporting -----------------------------------------------------

    def start(self, started: ChildStarted) -> None:
        """Drive the child run a freshly committed ChildStarted names."""
        create = child_create_run(self._run.state, started)
        self._start(started.node_id, started.attempt_id, started.child_run_id, create)

    def reconcile(self, effect: ReconcileChild) -> None:
        """After a restart: drive the child again if its attempt is still open, else cancel it."""
        state = self._run.state
        node = state.node_by_id(effect.node_id)
        assert node is not None, effect.node_id
        if node.attempt_id == effect.attempt_id:
            self._start(effect.node_id, effect.attempt_id, effect.child_run_id, None)
        elif effect.child_run_id not in self._cancelled:
            # Its attempt closed before the child run was picked up again: the child run
            # must not outlive it.
            self._cancelled.add(effect.child_run_id)
            why = f"parent run {state.run_id} closed attempt {effect.attempt_id}"
            self._cascade_cancel(effect.child_run_id, self._requester(effect.node_id), why)

    def finished(self, attempt_id: str, task: Task[Any]) -> None:
        """Report the child run whose task just ended."""
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
        self._done(attempt_id, report)

    def _requester(self, node_id: str) -> str:
        return f"parent {self._run.state.run_id}/{node_id}"

    def _start(self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None) -> None:
        """Drive the child run of a started child-call attempt: in a task of its own, or inline.

        ``create`` is the child's ``CreateRun`` for a fresh start, ``None`` to
        reconcile after a restart (resume the child, or create it if it never was).
        """
        run = self._run
        self._children[attempt_id] = (node_id, child_run_id)
        self._parked.pop(attempt_id, None)
        if run.concurrent:
            node = run.state.node_by_id(node_id)
            assert node is not None, node_id
            run.spawn_attempt(
                lambda: self._drive(node_id, attempt_id, child_run_id, create),
                name=f"{node_id}#{node.attempt} child {child_run_id}",
                node_id=node_id,
                attempt_id=attempt_id,
            )
            return
        report = self._drive(node_id, attempt_id, child_run_id, create)
        if run.cancel_requested:
            # The parent is being cancelled: its CancelRun closes this attempt, not the child's result.
            self._children.pop(attempt_id, None)
            return
        self._done(attempt_id, report)

    def _drive(
        self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None
    ) -> ChildReport:
        """Open child run ``child_run_id`` (create or resume it) and drive it until it ends or parks."""
        run = self._run
        node = run.state.node_by_id(node_id)
        assert node is not None, node_id
        call = node.spec.child
        assert call is not None
        lease, state, effects, created = self._open(node_id, attempt_id, child_run_id, create)
        try:
            # A run just created starts at virtual time 0, at the wall time recorded as its epoch.
            driver = run.nested(state, lease, wall_ms=state.epoch_ms if created else None)
            self._drivers[child_run_id] = (node_id, driver)
            if run.drivers is not None:
                run.drivers[child_run_id] = driver
            pending = self._pending_cancels.pop(child_run_id, None)
            if pending is not None:
                driver.request_cancel(*pending)
            try:
                final = driver.drive(effects)
            finally:
                del self._drivers[child_run_id]
                if run.drivers is not None:
                    run.drivers.pop(child_run_id, None)
        finally:
            if lease is not None:
                lease.release()
        if final.status.is_terminal:
            return ChildReport(final, child_completion(final, call.outputs), {})
        return ChildReport(final, None, driver.waits())

    def _open(
        self, node_id: str, attempt_id: str, child_run_id: str, create: CreateRun | None
    ) -> tuple[RecoveryLeaseGuard | None, RunState, tuple[RecoveryEffect, ...], bool]:
        """The child run's lease, state and recovery effects, and whether it was created (not resumed)."""
        run, context = self._run, self._run.context
        if create is None:
            try:
                lease, state, effects = self._resume(child_run_id)
            except RunNotFound:
                # The parent stopped after ChildStarted but before the child's RunCreated.
                create = self._recorded_create(child_run_id)
            else:
                link = state.parent
                parent = run.state
                if link is None or (link.run_id, link.node_id, link.attempt_id) != (
                    parent.run_id,
                    node_id,
                    attempt_id,
                ):
                    if lease is not None:
                        lease.release()
                    raise CorruptionError(
                        f"run {child_run_id} is not the child of run {parent.run_id} node {node_id!r} "
                        f"attempt {attempt_id} (its parent link is {link}); inspect both runs"
                    )
                return lease, state, effects, False
        # The child's virtual time counts from its own creation, in wall time like every run's.
        create = msgspec.structs.replace(create, epoch_ms=run.hub.clock.wall_ms())
        leases = context.leases
        lease = None if leases is None else leases.acquire(child_run_id, context.owner, context.lease_ttl_ms)
        try:
            commit = commit_command(
                context.journal,
                None,
                create,
                ids=context.ids,
                fence=None if lease is None else lease.fencing_token,
            )
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        context.observe(commit.state, commit.events)
        return lease, commit.state, (), True

    def _resume(
        self, child_run_id: str
    ) -> tuple[RecoveryLeaseGuard | None, RunState, tuple[RecoveryEffect, ...]]:
        context = self._run.context
        if context.leases is None:
            state = inspect_run(context.journal, child_run_id, upcasters=context.upcasters).state
            check_unfinished_handlers(state, context.registry.is_available)
            effects = recovery_effects(state)
            notify_recovery(context.observer, state, effects)
            return None, state, effects
        session = resume_run(
            context.journal,
            context.leases,
            child_run_id,
            owner=context.owner,
            ttl_ms=context.lease_ttl_ms,
            handler_available=context.registry.is_available,
            upcasters=context.upcasters,
        )
        notify_recovery(context.observer, session.state, session.effects)
        return session.lease, session.state, session.effects

    def _recorded_create(self, child_run_id: str) -> CreateRun:
        """The child's ``CreateRun`` from the parent's recorded ChildStarted (with the input as recorded)."""
        context, parent = self._run.context, self._run.state
        run_id = parent.run_id
        after = 0
        while True:
            records = context.journal.read(run_id, after=after, limit=1024)
            if not records:
                break
            for record in records:
                if record.event_type != "ChildStarted":
                    continue
                event = decode_event(
                    record.event_type, record.schema_version, record.payload, upcasters=context.upcasters
                )
                if isinstance(event, ChildStarted) and event.child_run_id == child_run_id:
                    return child_create_run(parent, event)
            after = records[-1].sequence
        raise CorruptionError(
            f"run {run_id} records no ChildStarted for child run {child_run_id}, yet its state names it; "
            f"inspect the run with `mayfly inspect {run_id}`"
        )

    def _done(self, attempt_id: str, report: ChildReport) -> None:
        """Commit a terminal child's result on the parent attempt, or remember the waits it parked on."""
        run = self._run
        node_id, child_run_id = self._children.pop(attempt_id)
        if run.state.status.is_terminal or not run.is_active(node_id, attempt_id):
            run.rejected_results += 1  # the run closed the attempt (and cancelled the child) meanwhile
            if report.completion is None:
                self._cancel_stopped(node_id, child_run_id)  # it parked before the cancel reached it
            return
        if report.completion is None:
            self._parked[attempt_id] = (node_id, child_run_id, report.waiting)
            return
        run.advance_time()  # the parent's outcome, and any retry delay, count from now
        if not run.is_active(node_id, attempt_id):
            run.rejected_results += 1
            return
        result = run.commit(report.completion)
        if isinstance(result, Rejection):
            if result.code in (RejectionCode.ATTEMPT_NOT_ACTIVE, RejectionCode.RUN_TERMINAL):
                run.rejected_results += 1
                return
            raise CommandRejected(result, f"result of child run {child_run_id} rejected: {result}")

    # -- cancelling -----------------------------------------------------------------

    def cancel_inline(self, reason: str) -> None:
        """The run is being cancelled in current-task mode: cancel its children now, naming it.

        That mode drives a child inline, so the parent's loop only sees its
        own cancellation once the child ends; the cascade follows from here.
        """
        why = bounded_reason(f"parent run {self._run.state.run_id} cancelled: {reason}")
        for node_id, child_run_id in list(self._children.values()):
            self._cancelled.add(child_run_id)
            live = self._drivers.get(child_run_id)
            if live is not None:
                live[1].request_cancel(self._requester(node_id), why)
            else:  # still being opened: cancelled as soon as its driver exists
                self._pending_cancels[child_run_id] = (self._requester(node_id), why)

    def cancel_closed(self, events: tuple[Event, ...]) -> None:
        """Cancel the child runs of child-call attempts the run just closed (or all, once it is terminal)."""
        completed = {e.attempt_id for e in events if isinstance(e, ChildCompleted)}
        state = self._run.state
        run_id = state.run_id
        for event in events:
            if isinstance(event, CancellationRequested):
                why = f"parent run {run_id} cancelled: {event.reason}"
                for target in event.targets:
                    if target.child_run_id is not None:
                        self._cancel(target.node_id, target.attempt_id, target.child_run_id, why)
            elif (
                isinstance(event, NodeOutcomeCommitted)
                and event.attempt_id is not None
                and event.attempt_id not in completed
            ):
                child = self._child_of(event.attempt_id)
                if child is not None:
                    why = f"parent attempt closed: {event.outcome.kind.value} ({event.outcome.reason})"
                    self._cancel(child[0], event.attempt_id, child[1], why)
        if state.status.is_terminal:
            for attempt_id in [*self._children, *self._parked]:
                child = self._child_of(attempt_id)
                assert child is not None
                self._cancel(child[0], attempt_id, child[1], f"parent run {run_id} ended")

    def join(self) -> None:
        """Once the run is terminal, wait for the child runs still being driven (being cancelled).

        A child whose driver had already stopped short of its end (parked on a
        signal) when the cancellation came is cancelled through its journal,
        so no child run outlives its parent.
        """
        run = self._run
        if not run.state.status.is_terminal:
            return
        for attempt_id, child in list(self._children.items()):
            task = run.task(attempt_id)
            if task is None:
                continue
            try:
                report = task.join()
            except TaskCancelled:
                continue  # the hub is shutting down
            except TaskFailed as failed:
                cause = failed.__cause__
                raise (cause if isinstance(cause, Exception) else failed) from None
            run.forget_task(attempt_id)
            assert isinstance(report, ChildReport)
            if not report.state.status.is_terminal:
                self._cancel_stopped(*child)

    def cancel_recorded(self) -> None:
        """For a run that is already cancelled: cancel the child runs its cancellation named, if still open.

        A process that cancelled the run without cascading (``mayfly cancel``)
        leaves them running; resuming the parent finishes the cascade.
        """
        state = self._run.state
        cancellation = state.cancellation
        if cancellation is None:
            return
        for target in cancellation.targets:
            if target.child_run_id is not None:
                self._cancelled.add(target.child_run_id)
                self._cascade_cancel(
                    target.child_run_id,
                    self._requester(target.node_id),
                    bounded_reason(f"parent run {state.run_id} cancelled: {cancellation.reason}"),
                )

    def _child_of(self, attempt_id: str) -> tuple[str, str] | None:
        child = self._children.get(attempt_id)
        if child is not None:
            return child
        parked = self._parked.get(attempt_id)
        return None if parked is None else (parked[0], parked[1])

    def _cancel(self, node_id: str, attempt_id: str, child_run_id: str, reason: str) -> None:
        """Cancel child run ``child_run_id`` once, naming this run's node as the requester."""
        self._parked.pop(attempt_id, None)
        if child_run_id in self._cancelled:
            return
        self._cancelled.add(child_run_id)
        requester, reason = self._requester(node_id), bounded_reason(reason)
        live = self._drivers.get(child_run_id)
        if live is not None:
            live[1].request_cancel(requester, reason)
        elif self._run.task(attempt_id) is not None:
            self._pending_cancels[child_run_id] = (requester, reason)  # its task has not opened it yet
        else:  # parked, or left behind by an earlier process: cancel it through its journal
            self._cascade_cancel(child_run_id, requester, reason)

    def _cancel_stopped(self, node_id: str, child_run_id: str) -> None:
        """Cancel, through its journal, a child run whose driver stopped before a cancellation reached it."""
        requester, reason = self._pending_cancels.pop(
            child_run_id, (self._requester(node_id), f"parent run {self._run.state.run_id} ended")
        )
        self._cancelled.add(child_run_id)
        self._cascade_cancel(child_run_id, requester, reason)

    def _cascade_cancel(self, child_run_id: str, requester: str, reason: str) -> None:
        """Cancel a child run (and its descendants) through the journal, under this driver's identity."""
        context = self._run.context
        cancel_run_cascade(
            context.journal,
            context.leases,
            child_run_id,
            requester=requester,
            reason=reason,
            owner=context.owner,
            ids=context.ids,
            ttl_ms=context.lease_ttl_ms,
            observer=context.observer,
            upcasters=context.upcasters,
        )


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
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> None:
    """Cancel run ``run_id`` through its journal, then in turn every child run its cancellation targets.

    For runs no live driver is driving (a parked child, a run left behind by
    an earlier process, or a root cancelled from a command line). A run that
    was never created, or is already terminal, is left as it is. Each run is
    leased while it is cancelled; ``LeaseHeld`` means another process drives
    it and must cancel it. Child runs name their parent (``"parent
    <run>/<node>"``) as requester. ``upcasters`` lift older event versions
    as each run's history is read.
    """
    pending = [(run_id, requester, reason)]
    while pending:
        run, who, why = pending.pop()
        if journal.next_sequence(run) == 1:
            continue  # never created (a child whose parent stopped before its RunCreated): no lease either
        lease = None if leases is None else leases.acquire(run, owner, ttl_ms)
        try:
            try:
                state = inspect_run(journal, run, upcasters=upcasters).state
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
                        nested = bounded_reason(f"parent run {run} cancelled: {why}")
                        pending.append((target.child_run_id, f"parent {run}/{target.node_id}", nested))
