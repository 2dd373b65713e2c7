"""``WorkflowTestEnv``: run workflows on an in-memory store and a virtual clock, and act at chosen times.

The env owns a :class:`~mayfly.testing.MemoryStore`, a
:class:`~mayfly.substrate.VirtualClock` and a
:class:`~mayfly.runtime.WorkflowRuntime` on them. Time moves only when a run
waits for it or the test says so:

- a drive (:meth:`~WorkflowTestEnv.start`, a signal, :meth:`~WorkflowTestEnv.advance`)
  runs the run on a hub of the virtual clock until it ends or can only go on
  through a signal; backoffs and attempt deadlines on the way fire at once,
  each at its own virtual time;
- :meth:`~WorkflowTestEnv.advance` moves the clock forward, and every run
  whose wake time (a signal deadline, a parked timer) falls inside the step is
  driven at that time, earliest first, so what an expiry starts sees the
  expiry's time;
- :meth:`~WorkflowTestEnv.signal` delivers a signal at the current virtual time
  (a signal after its wait's deadline is ``rejected``/``expired``, as in
  production) and drives the run on.

Runs are driven one at a time, in the order they became due; one run's
backoff moves the clock for all (the clock never goes back). Child runs are
driven by their root run, which waits (as a worker parks it) until a signal to
a child wakes it or a child's wake time comes.

Crashes: :meth:`~WorkflowTestEnv.crash_after` arms a crash right after the
commit of a chosen event. The drive stops there as a killed process would
(everything up to that commit is in the journal, nothing after it), the
runtime is dropped, and the next drive runs on a new runtime (a new owner) on
the same journal, which recovers the run: in-flight attempts are re-invoked
under their original attempt ids.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Self

import msgspec

from mayfly.model.errors import MayflyError
from mayfly.model.events import Event
from mayfly.model.ids import DeterministicIdSource, IdSource
from mayfly.model.json import JsonValue
from mayfly.model.signals import SignalToken
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import RunState
from mayfly.plugins import PluginManager
from mayfly.reducer import decode_event
from mayfly.runindex import IndexEntry, IndexStatus, index_entry
from mayfly.runtime import HandlerRegistry, RunResult, SignalDisposition, WorkflowRuntime
from mayfly.substrate import VirtualClock
from mayfly.testing._memory import MemoryJournal, MemoryLeaseStore, MemoryStore, drop_store

__all__ = ["EventPattern", "SimulatedCrash", "WorkflowTestEnv", "assert_events"]

_MS: Final = {"days": 86_400_000, "hours": 3_600_000, "minutes": 60_000, "seconds": 1_000}
DEFAULT_WALL_ORIGIN_MS: Final = int(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp() * 1000)
"""Where the env's wall clock starts (2026-01-01T00:00:00Z), so run epochs are the same on every run."""
_MAX_DRIVES: Final = 10_000  # drives one advance may make before it is a loop, not a workflow

EventPattern = type[Event] | str | tuple[type[Event] | str, dict[str, Any]]
"""An expected event: its class, its type name, or either with the field values it must have."""


class SimulatedCrash(BaseException):
    """Raised by an armed crash point to stop a drive as if its process were killed.

    A ``BaseException``, so no handler's ``except Exception`` and no runtime
    error handling stops it on its way out of the hub. The env catches it.
    """


def _type_name(kind: type[Event] | str) -> str:
    return kind if isinstance(kind, str) else kind.__name__


def _matches(event: Event, pattern: EventPattern) -> bool:
    kind, fields = pattern if isinstance(pattern, tuple) else (pattern, {})
    if type(event).__name__ != _type_name(kind):
        return False
    return all(getattr(event, name, _MISSING) == value for name, value in fields.items())


_MISSING: Final = object()


def _describe(pattern: EventPattern) -> str:
    kind, fields = pattern if isinstance(pattern, tuple) else (pattern, {})
    shown = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return f"{_type_name(kind)}({shown})" if shown else _type_name(kind)


def assert_events(history: Sequence[Event], expected: Sequence[EventPattern], *, exact: bool = False) -> None:
    """Assert that ``history`` holds the ``expected`` events in this order (others may come between).

    With ``exact`` the history must be exactly the expected events. A pattern
    is an event class, its type name, or ``(class or name, {field: value})``.
    The ``AssertionError`` names the first expected event not found and lists
    the history's event types.
    """
    names = [type(event).__name__ for event in history]
    if exact:
        if len(history) != len(expected) or not all(map(_matches, history, expected)):
            wanted = [_describe(pattern) for pattern in expected]
            raise AssertionError(f"history is {names}, expected exactly {wanted}")
        return
    position = 0
    for index, pattern in enumerate(expected):
        while position < len(history) and not _matches(history[position], pattern):
            position += 1
        if position == len(history):
            raise AssertionError(
                f"expected event {index} ({_describe(pattern)}) not found in order in the history {names}"
            )
        position += 1


def _delta_ms(ms: int, **units: float) -> int:
    total = ms + sum(_MS[unit] * amount for unit, amount in units.items())
    if total < 0:
        raise ValueError(f"time only moves forward: asked to move {total} ms")
    return int(total)


class WorkflowTestEnv:
    """A runtime on a fresh in-memory store and a virtual clock, driven step by step by a test.

    ``registry`` holds the handlers. ``wall_origin_ms`` is the wall time at
    virtual time 0 (default 2026-01-01T00:00:00Z); ids come from a
    :class:`~mayfly.ids.DeterministicIdSource` unless ``ids`` is given, so run
    ids repeat from test to test. ``plugins`` is the runtime's plugin context.
    Use it as a context manager (or call :meth:`close`) to drop the store.
    """

    def __init__(
        self,
        registry: HandlerRegistry | None = None,
        *,
        wall_origin_ms: int = DEFAULT_WALL_ORIGIN_MS,
        ids: IdSource | None = None,
        plugins: PluginManager | None = None,
        store: MemoryStore | None = None,
    ) -> None:
        self.clock = VirtualClock(wall_origin_ms=wall_origin_ms)
        self.store = store if store is not None else MemoryStore(clock=self.clock.wall_ms)
        self._own_store = store is None
        self.journal = MemoryJournal(self.store.url)
        self.leases = MemoryLeaseStore(self.store.url)
        self.registry = registry if registry is not None else HandlerRegistry()
        self.ids: IdSource = ids if ids is not None else DeterministicIdSource()
        self.plugins = plugins
        self.crashes: list[str] = []
        """The runs whose drive an armed crash point stopped, in order."""
        self._crash_points: list[Callable[[RunState, Event], bool]] = []
        self._generation = 0
        self.runtime = self._new_runtime()

    # -- time ----------------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """Virtual milliseconds since the env started."""
        return self.clock.now_ms()

    @property
    def wall_ms(self) -> int:
        """The env's wall clock: ``wall_origin_ms`` plus :attr:`now_ms`."""
        return self.clock.wall_ms()

    def advance(
        self, ms: int = 0, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0
    ) -> None:
        """Move virtual time forward, driving every run that falls due on the way at its own time."""
        self.advance_to(self.now_ms + _delta_ms(ms, days=days, hours=hours, minutes=minutes, seconds=seconds))

    def advance_to(self, at_ms: int) -> None:
        """Move virtual time to ``at_ms`` (since the env started), driving what falls due on the way.

        A drive stopped by an armed crash point ends the advance at the crash's time.
        """
        if at_ms < self.now_ms:
            raise ValueError(f"time only moves forward: now {self.now_ms} ms, asked for {at_ms} ms")
        target = self.clock.wall_ms() - self.now_ms + at_ms
        for _ in range(_MAX_DRIVES):
            if not self.run_until_parked():
                return  # a crash point stopped a drive: time stays where the crash happened
            due = [
                entry.ready_at_ms
                for entry in self._entries()
                if entry.status is IndexStatus.WAITING and entry.ready_at_ms is not None
            ]
            upcoming = min((wake for wake in due if wake <= target), default=None)
            if upcoming is None:
                break
            if upcoming > self.clock.wall_ms():
                self.clock.advance_to(self.now_ms + upcoming - self.clock.wall_ms())
        else:
            raise MayflyError(
                f"advance to {at_ms} ms made {_MAX_DRIVES} drives: a run falls due again and again"
            )
        if target > self.clock.wall_ms():
            self.clock.advance_to(self.now_ms + target - self.clock.wall_ms())

    # -- runs ----------------------------------------------------------------------------------

    def start(self, spec: WorkflowSpec, input: JsonValue = None, *, run_id: str | None = None) -> str:
        """Create a run of ``spec`` and drive it until it ends or parks on a signal; return its run id."""
        run_id = run_id if run_id is not None else self.ids.new_id()
        self._guarded(run_id, lambda: self._parked(self.runtime.execute(spec, input, run_id=run_id)))
        return run_id

    def run_until_parked(self) -> bool:
        """Drive every run that has work now (new, runnable, woken or due) until each ends or parks.

        Returns ``False`` if an armed crash point stopped a drive (the rest is
        left for the test to resume), else ``True``.
        """
        crashes = len(self.crashes)
        for _ in range(_MAX_DRIVES):
            now = self.clock.wall_ms()
            # A worker's claim order: higher priority first, then the time each became runnable or due.
            due = sorted(
                (entry for entry in self._entries() if _claimable(entry, now)),
                key=lambda e: (-e.priority, e.ready_at_ms is None, e.ready_at_ms or 0, e.run_id),
            )
            ready = [entry.run_id for entry in due]
            if not ready:
                return True
            for run_id in ready:
                before = self.journal.next_sequence(run_id)
                self._take_wake(run_id)
                self.resume(run_id)
                if len(self.crashes) > crashes:
                    return False
                entry = self.journal.index_get(run_id)
                stuck = entry is not None and _claimable(entry, self.clock.wall_ms())
                if stuck and self.journal.next_sequence(run_id) == before:
                    raise MayflyError(f"run {run_id} stays runnable but its drive wrote nothing")
        raise MayflyError(f"run_until_parked made {_MAX_DRIVES} rounds: runs keep becoming runnable")

    def resume(self, run_id: str) -> RunResult | None:
        """Drive one run now (as a worker that claimed it would); ``None`` if a crash point stopped it."""
        result: RunResult | None = None

        def drive() -> None:
            nonlocal result
            result = self._parked(self.runtime.resume(run_id))

        self._guarded(run_id, drive)
        return result

    def signal(
        self,
        run_id: str,
        node_id: str,
        *,
        token: SignalToken | str,
        decision: JsonValue = None,
        name: str | None = None,
        signal_id: str | None = None,
        drive: bool = True,
    ) -> SignalDisposition:
        """Deliver a signal at the current virtual time, then (``drive``) drive the runs it makes runnable.

        A signal arriving after its wait's deadline finds the wait expired
        (``rejected``, reason ``expired``), exactly as in production: the run's
        time is first brought up to now, which fires the deadline.
        """
        disposition = self.runtime.signal(run_id, node_id, token, decision, signal_id=signal_id, name=name)
        if drive:
            self.run_until_parked()
        return disposition

    # -- reading -------------------------------------------------------------------------------

    def result(self, run_id: str) -> RunResult:
        """The run's current :class:`~mayfly.RunResult` (status, nodes, outputs, waits), from the journal."""
        return self.runtime.summary(run_id)

    def state(self, run_id: str) -> RunState:
        """The run's current state, rebuilt from its whole history."""
        return self.runtime.replay(run_id).state

    def history(self, run_id: str) -> list[Event]:
        """The run's events in order, decoded from its journal records (through the plugins' upcasters)."""
        upcasters = self.runtime.upcasters
        return [
            decode_event(record.event_type, record.schema_version, record.payload, upcasters=upcasters)
            for record in self.journal.read(run_id)
        ]

    def event_types(self, run_id: str) -> list[str]:
        """The type names of the run's events, in order."""
        return [record.event_type for record in self.journal.read(run_id)]

    def assert_events(self, run_id: str, expected: Sequence[EventPattern], *, exact: bool = False) -> None:
        """:func:`assert_events` on the run's history."""
        assert_events(self.history(run_id), expected, exact=exact)

    # -- crashes -------------------------------------------------------------------------------

    def crash_after(
        self,
        event: type[Event] | str | Callable[[RunState, Event], bool],
        *,
        node: str | None = None,
        run_id: str | None = None,
        **fields: Any,
    ) -> None:
        """Arm a one-shot crash right after the commit of the next matching event.

        ``event`` is an event class or type name (narrowed by ``node``, the
        event's ``node_id``, by ``run_id`` and by field values), or a
        predicate ``(state, event) -> bool``. The drive that commits it stops
        there (:attr:`crashes` records the run), the runtime is dropped, and
        the next drive recovers the run on a new runtime.
        """
        if callable(event) and not isinstance(event, type):
            test = event
        else:
            name = _type_name(event)
            wanted = dict(fields) | ({} if node is None else {"node_id": node})

            def test(state: RunState, candidate: Event) -> bool:
                return (
                    type(candidate).__name__ == name
                    and (run_id is None or state.run_id == run_id)
                    and all(getattr(candidate, key, _MISSING) == value for key, value in wanted.items())
                )

        self._crash_points.append(test)

    def restart(self) -> WorkflowRuntime:
        """Drop the runtime and build a new one on the same journal (a process restart); return it."""
        self.runtime = self._new_runtime()
        return self.runtime

    def _observe(self, state: RunState, events: tuple[Event, ...]) -> None:
        for position, test in enumerate(self._crash_points):
            if any(test(state, event) for event in events):
                del self._crash_points[position]
                raise SimulatedCrash(f"simulated crash of run {state.run_id} at sequence {state.sequence}")

    def _guarded(self, run_id: str, drive: Callable[[], object]) -> None:
        try:
            drive()
        except SimulatedCrash:
            self.crashes.append(run_id)
            self.restart()

    def _new_runtime(self) -> WorkflowRuntime:
        self._generation += 1
        return WorkflowRuntime(
            self.journal,
            self.registry,
            leases=self.leases,
            plugins=self.plugins,
            ids=self.ids,
            clock=lambda: self.clock,
            owner=f"test-env-{self._generation}",
            # A day: renewals every 8 virtual hours, not every 10 s, across days of backoff.
            lease_ttl_ms=86_400_000,
            observer=self._observe,
        )

    def _parked(self, result: RunResult) -> RunResult:
        """Record a root run that waits only on its parked child runs as waiting, as a worker does.

        Its entry then wakes at the children's earliest wake time (a child's
        signal deadline), and a signal to a child wakes it (``index_wake``).
        """
        if result.status.is_terminal or not any("/" in wait for wait in result.waiting):
            return result
        with self.store.lock:
            entries = list(self.store.index.values())
        below, found = {result.run_id}, True
        while found:
            found = False
            for entry in entries:
                if entry.parent in below and entry.run_id not in below:
                    below.add(entry.run_id)
                    found = True
        wakes = [
            entry.ready_at_ms
            for entry in entries
            if entry.run_id in below
            and entry.run_id != result.run_id
            and entry.status is IndexStatus.WAITING
            and entry.ready_at_ms is not None
        ]
        state = self.runtime.inspect(result.run_id).state
        self.journal.index_put([index_entry(state, parked=True, parked_until=min(wakes, default=None))])
        return result

    def _take_wake(self, run_id: str) -> None:
        """Answer the run's wake request, as a worker's claim of it would."""
        with self.store.lock:
            entry = self.store.index.get(run_id)
            if entry is not None and entry.wake:
                self.store.index[run_id] = msgspec.structs.replace(entry, wake=False)

    def _entries(self) -> list[IndexEntry]:
        """The index entries of the store's unfinished root runs, in run id order."""
        with self.store.lock:
            entries = list(self.store.index.values())
        return sorted(
            (e for e in entries if e.parent is None and e.status is not IndexStatus.TERMINAL),
            key=lambda e: e.run_id,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the journal and lease store, and forget the store if the env made it."""
        self.journal.close()
        self.leases.close()
        if self._own_store:
            drop_store(self.store.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _claimable(entry: IndexEntry, now_ms: int) -> bool:
    if entry.status in (IndexStatus.NEW, IndexStatus.RUNNING) or entry.wake:
        return True
    return (
        entry.status is IndexStatus.WAITING and entry.ready_at_ms is not None and entry.ready_at_ms <= now_ms
    )
