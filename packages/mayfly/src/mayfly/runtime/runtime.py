"""``WorkflowRuntime``: run a specification durably with one call, or resume one after a crash.

Two ownership modes, as ADR-0032 Story 1.9 defines them:

- :meth:`WorkflowRuntime.execute` / :meth:`~WorkflowRuntime.resume` create and
  drive their own hub (the standalone adapter). Independent branches run
  concurrently; attempt deadlines are enforced.
- :meth:`WorkflowRuntime.execute_in_current_task` /
  :meth:`~WorkflowRuntime.resume_in_current_task` run inside a task of a hub
  the application already drives. They never start a second hub: ready
  handlers run serially in specification order, and specifications with
  attempt deadlines are rejected, because enforcing a concurrent timeout needs
  the standalone mode.

Child calls run as child runs of the same journal, leased by the same owner
and driven by the same runtime: concurrently beside the parent's other
branches in the standalone mode, inline (serially) in the current-task mode.
A child that parks on a signal keeps its parent running: ``execute`` returns
with the child's waits in :attr:`RunResult.waiting` as ``"node/child-node"``;
deliver the signal to the child run (:attr:`NodeSummary.child_run_id`), then
resume the *parent*, which resumes the child.

Plugins: a runtime is built with one plugin context (``plugins=``, by default
the process's entry-point manager, :func:`mayfly.plugins.plugin_manager`). It
opens journal URLs through the context's backends, runs its specification
validators wherever a specification is validated, and applies its event
upcasters wherever a run's history is read (:meth:`WorkflowRuntime.inspect`,
:meth:`~WorkflowRuntime.replay`, resume and signal delivery).

Time: a run's virtual time is the wall time since its epoch, which ``execute``
records from the clock in ``RunCreated``. ``resume`` (and a signal delivered
to a run no process drives) first advances the run to that time, so what came
due while nothing ran fires at once (ARCHITECTURE section 11, "Time across
downtime"). ``resume`` refuses, writing nothing, when a handler an unfinished
node needs is not registered (``ResumeRefused``, section 11 "Missing handlers").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Literal, final

import msgspec

from mayfly.commit import commit_command, keeps_run_index
from mayfly.identity import Uuid7IdSource
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.commands import AdvanceTime, CreateRun, DeliverSignal, Rejection, RejectionCode
from mayfly.model.errors import (
    AppendConflict,
    CommandRejected,
    FencingRejected,
    HubNotRunning,
    InvalidSignalToken,
    MayflyError,
    ValidationIssue,
)
from mayfly.model.events import Event, SignalRejected
from mayfly.model.ids import IdSource
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcomeKind, Succeeded
from mayfly.model.signals import SignalToken
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import PluginManager, Upcasters, plugin_manager
from mayfly.queues import check_queue_options
from mayfly.recovery import RecoveredRun, RecoveryEffect, inspect_run, replay_run, require_run, resume_run
from mayfly.reducer import check_input, decide
from mayfly.runindex import RUN_WAKEUPS
from mayfly.runtime._context import DriveContext, Observer, notify_recovery
from mayfly.runtime._driver import RunDriver, SignalRequest
from mayfly.runtime._time import catch_up, run_time_at
from mayfly.runtime.handle import RunHandle
from mayfly.runtime.registry import HandlerRegistry
from mayfly.substrate import Clock, Hub, RealClock, current_hub

__all__ = [
    "NodeSummary",
    "RunResult",
    "SignalDisposition",
    "UnsupportedInCurrentTask",
    "WorkflowRuntime",
]


class UnsupportedInCurrentTask(MayflyError):
    """The current-task mode cannot honour this specification (attempt deadlines need the standalone hub)."""


class SignalDisposition(msgspec.Struct, frozen=True):
    """What happened to a delivered signal: ``accepted``, ``rejected`` (with why) or ``already_consumed``."""

    signal_id: str
    status: Literal["accepted", "rejected", "already_consumed"]
    reason: str = ""

    @classmethod
    def of(cls, signal_id: str, result: list[Event] | Rejection) -> SignalDisposition:
        """Interpret ``decide``'s answer to a DeliverSignal command."""
        if isinstance(result, Rejection):
            if result.code is RejectionCode.SIGNAL_ALREADY_CONSUMED:
                return cls(signal_id, "already_consumed", result.message)
            raise CommandRejected(result, f"signal {signal_id} rejected: {result}")
        for event in result:
            if isinstance(event, SignalRejected):
                return cls(signal_id, "rejected", event.reason.value)
        return cls(signal_id, "accepted")


class NodeSummary(msgspec.Struct, frozen=True):
    """A node's final (or current) status, outcome class, attempts and non-success reason."""

    status: NodeStatus
    outcome: NodeOutcomeKind | None
    attempts: int
    reason: str = ""
    child_run_id: str | None = None
    """For a child-call node: the child run of its latest attempt."""


@final
class RunResult(msgspec.Struct, frozen=True):
    """A run's result: its status, each node's summary and the outputs of succeeded nodes."""

    run_id: str
    status: RunStatus
    sequence: int
    nodes: dict[str, NodeSummary]
    outputs: dict[str, JsonValue]
    waiting: dict[str, str] = {}
    """Nodes parked on a durable wait, with the signal name each waits for.

    A wait inside a parked child run is listed as ``"node/child-node"``
    (one more ``/child-node`` per nesting level).
    """

    @property
    def succeeded(self) -> bool:
        """Whether the run's terminal result is success."""
        return self.status is RunStatus.SUCCEEDED

    @classmethod
    def of(cls, state: RunState, *, waiting: Mapping[str, str] | None = None) -> RunResult:
        """Summarize ``state``; ``waiting`` replaces the waits read from it (a driver adds its children's)."""
        children: dict[str, str] = {}
        if any(node.spec.child is not None for node in state.nodes):
            # Attempt records keep every child run id, in start order; the node's latest wins.
            for record in state.to_record().attempts:
                if record.child_run_id is not None:
                    children[record.node_id] = record.child_run_id
        nodes: dict[str, NodeSummary] = {}
        outputs: dict[str, JsonValue] = {}
        for node in state.nodes:
            outcome = node.last_outcome
            nodes[node.node_id] = NodeSummary(
                status=node.status,
                outcome=None if outcome is None else outcome.kind,
                attempts=node.total_attempts,
                reason="" if outcome is None else outcome.reason,
                child_run_id=children.get(node.node_id),
            )
            if isinstance(outcome, Succeeded) and node.status is NodeStatus.SUCCEEDED:
                outputs[node.node_id] = outcome.output
        if waiting is None:
            waiting = {node.node_id: node.wait.name for node in state.nodes if node.wait is not None}
        return cls(state.run_id, state.status, state.sequence, nodes, outputs, dict(waiting))


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkflowRuntime:
    """Executes, resumes and reads workflow runs on one journal with registered handlers.

    ``journal`` is a :class:`~mayfly.journal.WorkflowJournal` or a URL such as
    ``"file://./.mayfly"`` (opened through the backends of ``plugins``);
    ``leases`` defaults to the store at the same URL. ``registry`` may be left
    out by a runtime that only reads, signals or cancels runs. ``plugins`` is
    the plugin context (default: the process's entry-point manager): its spec
    validators and event upcasters apply to everything this runtime does. ``clock`` chooses the
    hub clock for standalone runs: pass a :class:`~mayfly.substrate.VirtualClock`
    to run hour-long backoffs in milliseconds. Its wall reading
    (:meth:`~mayfly.substrate.Clock.wall_ms`) is recorded as a new run's
    epoch and measures the time elapsed since, across processes.
    """

    def __init__(
        self,
        journal: WorkflowJournal | str,
        registry: HandlerRegistry | None = None,
        *,
        plugins: PluginManager | None = None,
        leases: RecoveryLeaseStore | None = None,
        ids: IdSource | None = None,
        clock: Callable[[], Clock] | None = None,
        owner: str | None = None,
        lease_ttl_ms: int = 30_000,
        snapshot_every: int = 1_000,
        observer: Observer | None = None,
    ) -> None:
        # Checked before any store is opened: a TTL under 3 ms cannot be renewed every third of it
        # (the driver would spin renewing), and the lease stores accept at most a day.
        if not 3 <= lease_ttl_ms <= 86_400_000:
            raise ValueError(f"lease_ttl_ms must be between 3 and 86400000, got {lease_ttl_ms}")
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1 committed records, got {snapshot_every}")
        if plugins is None:
            plugins = plugin_manager()
        if isinstance(journal, str):
            url = journal
            journal = plugins.open_journal(url)
            leases = leases if leases is not None else plugins.open_leases(url)
        if leases is None:
            raise TypeError("pass leases= (a RecoveryLeaseStore) when journal is an object")
        if ids is None:
            ids = Uuid7IdSource()
        self.journal = journal
        self.leases = leases
        self.registry = registry if registry is not None else HandlerRegistry()
        self.plugins = plugins
        self.ids = ids
        self._clock = clock
        self.owner = owner if owner is not None else _default_owner()
        self.lease_ttl_ms = lease_ttl_ms
        self.snapshot_every = snapshot_every
        self.observer = observer
        self._drivers: dict[str, RunDriver] = {}

    # -- public entry points --------------------------------------------------------

    def execute(
        self,
        spec: WorkflowSpec,
        input: JsonValue = None,
        *,
        run_id: str | None = None,
        detach_on_wait: bool = True,
    ) -> RunResult:
        """Create a run of ``spec`` and drive it on a new hub until it ends or parks on a signal.

        With ``detach_on_wait`` (the default) the call returns as soon as the
        run can only progress through an external signal: the run stays
        durably parked (``result.waiting`` names the waits) until someone
        delivers the signal and resumes it. Otherwise the hub keeps waiting
        until the wait's deadline.
        """
        run_id = self._prepare(spec, input, run_id)
        return self._hub().run(self._create_and_drive, spec, input, run_id, True, detach_on_wait)

    def start(
        self,
        spec: WorkflowSpec,
        input: JsonValue = None,
        *,
        run_id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        dedup_id: str | None = None,
    ) -> RunHandle:
        """Create a run of ``spec`` durably and return at once; a worker drives it.

        The run is validated (the plugins' validators included) and created
        with its epoch and ``queue``; this process needs no handlers for it.
        Choosing ``run_id`` makes the call idempotent: starting a run id that
        exists returns its handle and creates nothing. Works outside a hub and
        inside a hub task alike.

        ``priority`` (higher is claimed first) needs a queue that enables
        priorities; ``dedup_id`` allows one live run per id on the queue and
        raises :class:`~mayfly.errors.DuplicateRun` while another lives. Both
        need a journal that declares ``queue_control`` (:mod:`mayfly.queues`).
        """
        self.plugins.ensure_valid(spec)
        check_input(input, "run input")
        chosen = run_id is not None
        run_id = run_id if run_id is not None else self.ids.new_id()
        handle = RunHandle(self, run_id)
        if priority != 0 or dedup_id is not None:
            check_queue_options(self.journal, queue, priority, dedup_id)
        # A run id chosen by the caller may exist already (a repeated start); a fresh one cannot, and the
        # create below is refused for an existing run anyway: only a chosen id is worth a read first.
        if chosen and self.journal.next_sequence(run_id) > 1:
            return handle
        # No lease: creating is a compare-and-append at sequence 1 with no fence, which only a run that
        # nobody ever leased accepts. So of racing starts of one run id exactly one creates it, and a
        # start racing a process that leased the id first (to create and drive it) creates nothing.
        command = CreateRun(
            run_id=run_id,
            spec=spec,
            input=input,
            epoch_ms=self._wall_ms(),
            queue=queue,
            priority=priority,
            dedup_id=dedup_id,
        )
        try:
            commit = commit_command(self.journal, None, command, ids=self.ids, fence=None)
        except (AppendConflict, FencingRejected):
            return handle  # created meanwhile, or being created, by another process
        if self.observer is not None:
            self.observer(commit.state, commit.events)
        if not self.journal.capabilities.append_wakeups:  # else the create itself woke the workers
            self._notify_workers()
        return handle

    def handle(self, run_id: str) -> RunHandle:
        """The handle of an existing run (:class:`~mayfly.errors.RunNotFound` if the journal has none)."""
        require_run(self.journal, run_id)
        return RunHandle(self, run_id)

    def execute_in_current_task(
        self, spec: WorkflowSpec, input: JsonValue = None, *, run_id: str | None = None
    ) -> RunResult:
        """Like :meth:`execute`, inside the calling hub task (serial handlers, no attempt deadlines)."""
        current_hub()  # raises HubNotRunning outside a hub task
        self._reject_deadlines(spec)
        run_id = self._prepare(spec, input, run_id)
        return self._create_and_drive(spec, input, run_id, False, False)

    def resume(
        self,
        run_id: str,
        *,
        detach_on_wait: bool = True,
        on_recovery: Callable[[RunState, tuple[RecoveryEffect, ...]], None] | None = None,
    ) -> RunResult:
        """Take over a run (non-blocking lease) and drive it on a new hub until it ends or parks.

        ``on_recovery`` is told the recovered state and the recovery plan once
        the lease is held, before anything is re-invoked (a run owned by
        another process raises ``LeaseHeld`` without calling it).
        """
        return self._hub().run(self._resume_and_drive, run_id, True, detach_on_wait, on_recovery)

    def resume_in_current_task(self, run_id: str) -> RunResult:
        """Like :meth:`resume`, inside the calling hub task."""
        current_hub()
        return self._resume_and_drive(run_id, False, False)

    @property
    def upcasters(self) -> Upcasters:
        """The event upcasters of this runtime's plugin context, applied on every read of a history."""
        return self.plugins.event_upcasters()

    def validate(self, spec: WorkflowSpec) -> list[ValidationIssue]:
        """Every issue :meth:`execute` would refuse ``spec`` for: the core's, then each plugin validator's."""
        return self.plugins.validate(spec)

    def inspect(self, run_id: str) -> RecoveredRun:
        """Read a run's state (from its snapshot and the journal tail), through the plugins' upcasters."""
        return inspect_run(self.journal, run_id, upcasters=self.upcasters)

    def summary(self, run_id: str) -> RunResult:
        """The run's current :class:`RunResult` (status, nodes, outputs, waits), read from the journal."""
        return RunResult.of(self.inspect(run_id).state)

    @staticmethod
    def summary_of(state: RunState) -> RunResult:
        """The :class:`RunResult` of ``state``."""
        return RunResult.of(state)

    def replay(self, run_id: str) -> RecoveredRun:
        """Reduce a run's complete history, ignoring snapshots, through the plugins' upcasters."""
        return replay_run(self.journal, run_id, upcasters=self.upcasters)

    def signal(
        self,
        run_id: str,
        node_id: str,
        token: SignalToken | str,
        decision: JsonValue = None,
        *,
        signal_id: str | None = None,
        name: str | None = None,
    ) -> SignalDisposition:
        """Deliver a signal to a waiting node; returns its disposition.

        If this runtime is driving the run (called from another task of the
        same hub), the driver records it; otherwise the run's lease is taken
        for the delivery (``LeaseHeld`` if another process owns the run) and
        the run stays parked until it is resumed: its virtual time is first
        advanced to the wall time since its epoch, so a signal that comes after
        the wait's deadline finds the wait expired. A wait inside a child run
        is answered on the child run (``result.nodes[node].child_run_id``);
        resume the root run afterwards.

        A malformed token, signal id or decision, or an unknown node, raises
        :class:`CommandRejected` (``rejection.code`` is ``invalid_input`` or
        ``unknown_node``) and an unknown run :class:`RunNotFound`; nothing is
        written for any of them.
        """
        try:
            raw = token if isinstance(token, SignalToken) else SignalToken(token)
        except InvalidSignalToken as exc:
            # Refused before the lease is taken: a malformed token changes nothing anywhere.
            rejection = Rejection(
                RejectionCode.INVALID_INPUT, f"signal to run {run_id} node {node_id!r}: {exc}"
            )
            raise CommandRejected(rejection, f"signal rejected: {rejection}") from None
        signal_id = signal_id if signal_id is not None else self.ids.new_id()
        driver = self._drivers.get(run_id)
        if driver is not None:
            request = SignalRequest(node_id, signal_id, raw, decision, name)
            driver.request_signal(request)
            request.done.wait()
            if request.error is not None:
                raise request.error
            return SignalDisposition.of(signal_id, request.result)
        require_run(self.journal, run_id)
        with self.leases.acquire(run_id, self.owner, self.lease_ttl_ms) as lease:
            state = self.inspect(run_id).state
            command = DeliverSignal(
                node_id=node_id, signal_id=signal_id, token=raw, decision=decision, name=name
            )

            def commit_time(current: RunState, advance: AdvanceTime) -> RunState:
                done = commit_command(self.journal, current, advance, ids=self.ids, fence=lease.fencing_token)
                if self.observer is not None:
                    self.observer(done.state, done.events)
                return done.state

            # Only a delivery that would be recorded brings the run's time up to date first: a refused
            # one (unknown node, bad input, a consumed signal id, an ended run) still writes nothing.
            if not isinstance(decide(state, command), Rejection):
                state = catch_up(state, run_time_at(state, self._wall_ms()), commit_time)
            try:
                commit = commit_command(self.journal, state, command, ids=self.ids, fence=lease.fencing_token)
            except CommandRejected as rejected:
                assert isinstance(rejected.rejection, Rejection)
                return SignalDisposition.of(signal_id, rejected.rejection)
            if self.observer is not None:
                self.observer(commit.state, commit.events)
            self._wake_ancestors(commit.state)
            disposition = SignalDisposition.of(signal_id, list(commit.events))
        self._notify_workers()  # the run's lease is released: a worker can claim it now
        return disposition

    def _notify_workers(self) -> None:
        """Tell idle workers that a run became claimable now, where the journal offers wake-ups."""
        wakeups = RUN_WAKEUPS.of(self.journal)
        if wakeups is not None:
            wakeups.notify_wakeups()

    def _wake_ancestors(self, state: RunState) -> None:
        """A child run took a signal: wake the runs above it, which a worker parked on it (run index)."""
        journal = self.journal
        if not keeps_run_index(journal):
            return
        link = state.parent
        while link is not None:
            journal.index_wake(link.run_id)
            link = inspect_run(self.journal, link.run_id, upcasters=self.upcasters).state.parent

    def cancel(self, run_id: str, *, reason: str, requester: str = "runtime") -> None:
        """Cancel a run this runtime is driving on the current hub (from another task).

        Its open child runs are cancelled in turn, each naming its parent
        (``"parent <run>/<node>"``) as the requester.
        """
        driver = self._drivers.get(run_id)
        if driver is None:
            raise MayflyError(
                f"run {run_id} is not being driven by this runtime; cancel it with its owner, "
                "or with `mayfly cancel` once no process owns it"
            )
        driver.request_cancel(requester, reason)

    # -- internals ------------------------------------------------------------------

    def _hub(self) -> Hub:
        return Hub(self._clock() if self._clock is not None else None)

    def _wall_ms(self) -> int:
        """The wall clock outside a driver: the running hub's, else this runtime's clock."""
        try:
            return current_hub().clock.wall_ms()
        except HubNotRunning:
            return (self._clock() if self._clock is not None else RealClock()).wall_ms()

    def _prepare(self, spec: WorkflowSpec, input: JsonValue, run_id: str | None) -> str:
        self.plugins.ensure_valid(spec)
        check_input(input, "run input")
        self.registry.check(spec)
        return run_id if run_id is not None else self.ids.new_id()

    @staticmethod
    def _reject_deadlines(spec: WorkflowSpec) -> None:
        with_deadlines = [n.id for n in spec.nodes if n.retry.attempt_deadline_ms is not None]
        # Child runs are driven inline too, so their catalog workflows must not need deadlines either.
        with_deadlines += [
            f"{child.workflow_id}@{child.version}/{n.id}"
            for child in spec.catalog
            for n in child.nodes
            if n.retry.attempt_deadline_ms is not None
        ]
        if with_deadlines:
            raise UnsupportedInCurrentTask(
                f"attempt deadlines need the standalone runtime (WorkflowRuntime.execute); "
                f"nodes with deadlines: {', '.join(with_deadlines)}"
            )

    def _create_and_drive(
        self, spec: WorkflowSpec, input: JsonValue, run_id: str, concurrent: bool, detach: bool
    ) -> RunResult:
        asked_ms = current_hub().now_ms()
        lease = self.leases.acquire(run_id, self.owner, self.lease_ttl_ms)
        # The run's epoch: virtual time 0 is now, in the wall time of the injected clock.
        epoch_ms = current_hub().clock.wall_ms()
        try:
            try:
                commit = commit_command(
                    self.journal,
                    None,
                    CreateRun(run_id=run_id, spec=spec, input=input, epoch_ms=epoch_ms),
                    ids=self.ids,
                    fence=lease.fencing_token,
                )
            except AppendConflict:
                # Under the run's lease, a first record that does not fit means the run exists.
                rejection = Rejection(
                    RejectionCode.RUN_EXISTS,
                    f"run {run_id} already exists in {self.journal.url}; resume it or use a new run id",
                )
                raise CommandRejected(rejection, f"CreateRun rejected: {rejection}") from None
            if self.observer is not None:
                self.observer(commit.state, commit.events)
            driver = self._driver(
                commit.state, lease, concurrent, detach, wall_ms=epoch_ms, asked_ms=asked_ms
            )
            return self._drive(driver, ())
        finally:
            lease.release()

    def _resume_and_drive(
        self,
        run_id: str,
        concurrent: bool,
        detach: bool,
        on_recovery: Callable[[RunState, tuple[RecoveryEffect, ...]], None] | None = None,
    ) -> RunResult:
        asked_ms = current_hub().now_ms()
        session = resume_run(
            self.journal,
            self.leases,
            run_id,
            owner=self.owner,
            ttl_ms=self.lease_ttl_ms,
            handler_available=self.registry.is_available,
            upcasters=self.upcasters,
        )
        with session:
            if not concurrent:
                self._reject_deadlines(session.state.spec)
            if on_recovery is not None:
                on_recovery(session.state, session.effects)
            notify_recovery(self.observer, session.state, session.effects)
            driver = self._driver(session.state, session.lease, concurrent, detach, asked_ms=asked_ms)
            return self._drive(driver, session.effects)

    def _driver(
        self,
        state: RunState,
        lease: Any,
        concurrent: bool,
        detach: bool,
        *,
        wall_ms: int | None = None,
        asked_ms: int | None = None,
    ) -> RunDriver:
        return RunDriver(
            self._context(),
            state,
            lease=lease,
            concurrent=concurrent,
            detach_on_wait=detach,
            drivers=self._drivers,
            wall_ms=wall_ms,
            lease_asked_ms=asked_ms,
        )

    def _context(self) -> DriveContext:
        """What every run this runtime drives shares (read afresh: the attributes are public)."""
        return DriveContext(
            journal=self.journal,
            registry=self.registry,
            ids=self.ids,
            lease_ttl_ms=self.lease_ttl_ms,
            snapshot_every=self.snapshot_every,
            leases=self.leases,
            owner=self.owner,
            observer=self.observer,
            upcasters=self.upcasters,
        )

    def _drive(self, driver: RunDriver, effects: tuple[Any, ...]) -> RunResult:
        run_id = driver.state.run_id
        self._drivers[run_id] = driver
        try:
            state = driver.drive(effects)
            return RunResult.of(state, waiting=driver.waits())
        finally:
            del self._drivers[run_id]
