"""``Worker``: Mayfly as a service that claims runs from the run index and drives many at once.

A worker runs one greenlet hub. Its main task claims runs that are claimable
now (:mod:`mayfly.runindex`: new, running with no live owner, waiting with a
wake time that came or a wake request) up to its concurrency, and drives each
in a task of its own with full standalone semantics: concurrent handlers,
enforced attempt deadlines, child runs. A run that can only wait — for a
signal, or for a deadline further away than the poll interval — is detached:
its lease is released and the index wakes it again when its time comes, so a
parked run holds no slot and no memory.

Recovery is continuous and keyed by leases, not by process identity: a run
whose owner died is claimable as soon as its lease expires (at once on the
embedded backends, whose leases are OS locks), whichever worker started
first. A run whose handlers this worker lacks is left untouched (its lease is
released at once and the refusal logged once), so a worker that has them
takes it. Fencing on every append stays the safety net: an owner that lost
its lease has its next append refused and lets the run go.

Stopping (:meth:`Worker.stop`, SIGTERM or SIGINT under :meth:`Worker.serve`):
no new claims, in-flight attempts get ``grace_ms`` to finish while leases are
still renewed, then every lease is released (the runs are claimable by another
worker at once) and :meth:`Worker.run` returns. A second stop aborts at once:
attempts still in flight stay in flight in the journal and the next owner
re-invokes them under their original attempt ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any, TextIO, final

from mayfly.commit import keeps_run_index
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.errors import (
    CorruptionError,
    FencingRejected,
    JournalUnavailable,
    LeaseLost,
    MayflyError,
    ResumeRefused,
)
from mayfly.model.state import RunState
from mayfly.queues import QUEUE_CONTROL
from mayfly.recovery import resume_claimed
from mayfly.runindex import RUN_WAKEUPS, RunIndexJournal, WakeupListener, index_entry
from mayfly.runtime import HandlerRegistry, WorkflowRuntime
from mayfly.runtime._context import notify_recovery
from mayfly.runtime._driver import RunDriver
from mayfly.schedules import SCHEDULE_STORE, Schedule, StoredSchedule, check_schedules, tick_run_id
from mayfly.substrate import Channel, Hub, Task, WaitTimeout, current_hub, spawn, wait_readable
from mayfly.telemetry.metrics import WorkerEvent, WorkerMetrics

__all__ = ["Worker", "WorkerUnsupported"]

_BACKOFF_MS = (100, 200, 500, 1_000, 2_000, 5_000)
_MAX_OFFLOAD_WORKERS = 64
_SKIP_AT_MOST = 64  # refused runs one poll's claim holds back to reach the runs behind them
_REFUSED_KEPT = 10_000  # refused runs a worker remembers


class WorkerUnsupported(MayflyError):
    """The journal keeps no run index, so a worker cannot find runs in it."""


@final
class Worker:
    """Claims runs from ``journal``'s run index and drives up to ``concurrency`` of them at once.

    ``journal`` is a URL or an opened journal (with ``leases=``), as for
    :class:`~mayfly.runtime.WorkflowRuntime`, which every other keyword
    (``plugins``, ``clock``, ``owner``, ``lease_ttl_ms``, ``snapshot_every``,
    ``observer``, ``ids``, ``leases``) is passed to. ``queues`` limits the
    worker to those queues (``None``: every queue). ``poll_interval_ms`` is
    how often an idle worker looks for work it was not told about;
    ``grace_ms`` how long a stopping worker lets in-flight attempts finish.
    ``log`` receives one dict per event (``claimed``, ``ended``, ``parked``,
    ``refused``, ``lost``, ``error``, ``stopping``, ``stopped``); by default
    lines are written to stderr. ``schedules`` are schedules given in code
    (:mod:`mayfly.schedules`); the worker also serves the schedules stored in
    the journal (feature ``schedule_store``), re-read every poll interval.
    """

    def __init__(
        self,
        journal: WorkflowJournal | str,
        registry: HandlerRegistry,
        *,
        concurrency: int = 16,
        queues: Sequence[str] | None = None,
        poll_interval_ms: int = 1_000,
        grace_ms: int = 30_000,
        log: Callable[[dict[str, Any]], None] | None = None,
        schedules: Sequence[Schedule] = (),
        command: str = "mayfly",
        **runtime: Any,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 10**5:
            raise ValueError(f"concurrency must be an int in [1, 100000], got {concurrency!r}")
        if not 1 <= poll_interval_ms <= 3_600_000:
            raise ValueError(f"poll_interval_ms must be in [1, 3600000], got {poll_interval_ms!r}")
        if not 0 <= grace_ms <= 86_400_000:
            raise ValueError(f"grace_ms must be in [0, 86400000], got {grace_ms!r}")
        self.runtime = WorkflowRuntime(journal, registry, **runtime)
        self._control = QUEUE_CONTROL.of(self.runtime.journal)
        self._schedule_store = SCHEDULE_STORE.of(self.runtime.journal)
        if not keeps_run_index(self.runtime.journal):
            raise WorkerUnsupported(
                f"journal {self.runtime.journal.url} keeps no run index, so a worker cannot find its runs; "
                "use a backend that declares the run_index feature (file, lmdb, postgresql, "
                "or redis: a standalone server, or a Redis Cluster store with a sharded run index; "
                "see docs/backends/redis.md)"
            )
        self.index: RunIndexJournal = self.runtime.journal
        self.concurrency = concurrency
        self.queues = None if queues is None else tuple(queues)
        self.poll_interval_ms = poll_interval_ms
        self.grace_ms = grace_ms
        self._log = log if log is not None else _text_log(sys.stderr)
        self._active: dict[str, Task[None]] = {}
        self._refused: dict[str, None] = {}  # runs it will not drive, oldest first (_REFUSED_KEPT at most)
        self._done: Channel[Any] = Channel()
        self._stops = 0
        self._hogs: set[str] = set()
        self._until: Callable[[], bool] | None = None
        self.hog_ms = max(50, self.runtime.lease_ttl_ms // 10)
        self._stop_pipe: tuple[int, int] | None = None
        self.claimed = 0
        self.ended = 0
        self._events: dict[WorkerEvent, int] = {}  # every logged event, by closed kind (metrics())
        self.schedules = check_schedules(schedules)
        self.command = command  # how the commands this worker prints start (the CLI: the path it ran by)
        self._ticked: dict[str, int] = {}  # schedule name -> the latest tick whose run this worker started
        self._stored: dict[str, StoredSchedule] = {}  # the journal's schedules, re-read every poll interval
        self._stored_read_at: float | None = None
        self._notes: set[str] = set()  # problems already logged (each once): a schedule's, skipped runs
        self._queue_of: dict[str, str] = {}  # active run -> its queue (for per-worker queue limits)
        self._caps: dict[str, int] = {}  # queue -> its worker_concurrency, re-read every poll interval
        self._caps_read_at: float | None = None

    @property
    def owner(self) -> str:
        """The owner name this worker's leases carry."""
        return self.runtime.owner

    # -- lifecycle ---------------------------------------------------------------------

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        """Serve until stopped: claim, drive, detach, repeat (on a new hub on this thread).

        ``until`` (checked whenever the worker wakes: a run ended or parked,
        or a poll) stops the worker gracefully once it returns true, which is
        how a test or a batch job serves "until these runs are done".
        """
        self._until = until
        clock = self.runtime._clock
        # Blocking handlers and journal flushes cross the offload pool: size it for the runs driven at once.
        workers = min(_MAX_OFFLOAD_WORKERS, self.concurrency + 4)
        hub = Hub(
            clock() if clock is not None else None,
            offload_workers=workers,
            hog_ms=self.hog_ms,
            on_hog=self._hogged,
        )
        hub.run(self._main)

    def _hogged(self, task: str, ms: int) -> None:
        if task in self._hogs:
            return
        self._hogs.add(task)
        self._emit(
            "hog",
            task=task,
            ms=ms,
            error=(
                f"task {task!r} ran {ms} ms without yielding: every other run, timer and lease renewal "
                "waited for it; run blocking work in a non-cooperative handler (offloaded) or yield"
            ),
        )

    def serve(self) -> int:
        """:meth:`run`, with SIGTERM and SIGINT stopping the worker; returns 0, or 130 when aborted."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._stop_pipe = (read, write)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del frame
            with contextlib.suppress(OSError):
                os.write(write, bytes([signum]))

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(read)
            os.close(write)
            self._stop_pipe = None
        return 130 if self._stops > 1 else 0

    def stop(self) -> None:
        """Stop claiming and drain (from a task on the worker's hub); a second call aborts."""
        self._stops += 1
        self._done.send(None)

    # -- the main task -----------------------------------------------------------------

    def _main(self) -> None:
        if self._stop_pipe is not None:
            spawn(self._watch_signals, self._stop_pipe[0], name="worker signal watch")
        wakeups = RUN_WAKEUPS.of(self.runtime.journal)
        listener = None if wakeups is None else wakeups.listen_wakeups()
        try:
            if listener is not None:
                spawn(self._watch_wakeups, listener, name="worker wake-ups")
            self._serve()
        finally:
            if listener is not None:
                listener.close()

    def _watch_wakeups(self, listener: WakeupListener) -> None:
        while True:
            wait_readable(listener.fileno())
            listener.drain()
            self._done.send(None)

    def _serve(self) -> None:
        self._emit("started", concurrency=self.concurrency, queues=list(self.queues or ["*"]))
        self._check_index()
        failures = 0
        while not self._stops:
            if self._until is not None and self._until():
                self.stop()
                break
            free = self.concurrency - len(self._active)
            wake_in_ms = self._fire_schedules(self.poll_interval_ms)
            if free > 0:
                asked_ms = current_hub().now_ms()  # the leases are surely held until this plus the TTL
                try:
                    guards = self._claim(free)
                    failures = 0
                except (JournalUnavailable, OSError) as exc:
                    # A store restart or a network blip: retry with backoff, never give up.
                    wake_in_ms = _BACKOFF_MS[min(failures, len(_BACKOFF_MS) - 1)]
                    failures += 1
                    self._emit("error", error=f"claim failed: {exc}; retrying in {wake_in_ms} ms")
                    guards = []
                for guard in guards:
                    self._start(guard, asked_ms)
                if guards and len(guards) == free:
                    continue  # more may be claimable at once
                if not failures:
                    wake_in_ms = self._next_wake_in(wake_in_ms)
            self._pause(wake_in_ms)
        self._drain()

    def _claim(self, free: int) -> list[RecoveryLeaseGuard]:
        """Claim up to ``free`` runs this worker can drive, skipping the ones it refused before.

        A run this worker lacks handlers for stays claimable (another worker
        has them) and, being older, comes first in claim order: each one
        claimed is held back, not released, while the claim goes on, so the
        next claim reaches the runs behind it; then they are all released.
        At most ``_SKIP_AT_MOST`` are skipped in one poll.
        """
        now = self.runtime._wall_ms()
        ttl = self.runtime.lease_ttl_ms
        if self._control is not None:
            self._read_caps()
        taken: list[RecoveryLeaseGuard] = []
        skipped: list[RecoveryLeaseGuard] = []
        try:
            while len(taken) < free:
                want = free - len(taken)
                guards = self._claim_some(want, ttl, now, taken)
                skips = 0
                for guard in guards:
                    if guard.run_id in self._refused or guard.run_id in self._active:
                        skipped.append(guard)  # not for this worker: another one (with the handlers) takes it
                        skips += 1
                    else:
                        taken.append(guard)
                        if self._caps:
                            # Learn the run's queue now, not when its task reads it: the next claim counts it.
                            entry = self.index.index_get(guard.run_id)
                            if entry is not None:
                                self._queue_of[guard.run_id] = entry.queue
                if not skips or len(guards) < want:
                    break
                if len(skipped) >= _SKIP_AT_MOST:
                    self._note(
                        "skipped",
                        f"more than {_SKIP_AT_MOST} runs this worker lacks handlers for come before the runs "
                        "it can drive; it skips that many per poll, so give them a queue of their own and "
                        "start this worker with --queue for its runs",
                        skipped=len(skipped),
                    )
                    break
        finally:
            for guard in skipped:
                guard.release()
        return taken

    def _claim_some(
        self, limit: int, ttl: int, now: int, taken: Sequence[RecoveryLeaseGuard]
    ) -> list[RecoveryLeaseGuard]:
        if self._control is None:
            return self.index.claim(self.owner, limit=limit, ttl_ms=ttl, now_ms=now, queues=self.queues)
        holding = [*self._active, *(guard.run_id for guard in taken)]
        held = Counter(self._queue_of[run] for run in holding if run in self._queue_of)
        # The backend enforces every queue limit in the claim: global ones from its settings, this
        # worker's from what it says it holds.
        return self._control_claim(limit, ttl, now, dict(held))

    def _control_claim(self, free: int, ttl: int, now: int, held: dict[str, int]) -> list[RecoveryLeaseGuard]:
        claim: Callable[..., list[RecoveryLeaseGuard]] = self.index.claim
        return claim(self.owner, limit=free, ttl_ms=ttl, now_ms=now, queues=self.queues, held=held)

    def _read_caps(self) -> None:
        """Re-read the queues' per-worker limits at most once per poll interval."""
        assert self._control is not None
        now = time.monotonic()
        if self._caps_read_at is not None and now - self._caps_read_at < self.poll_interval_ms / 1000:
            return
        self._caps = {
            queue.name: queue.worker_concurrency
            for queue in self._control.queue_list()
            if queue.worker_concurrency is not None
        }
        self._caps_read_at = now

    def _read_stored(self) -> None:
        """Re-read the journal's schedules at most once per poll interval (keeping the last good set)."""
        store = self._schedule_store
        if store is None:
            return
        now = time.monotonic()
        if self._stored_read_at is not None and now - self._stored_read_at < self.poll_interval_ms / 1000:
            return
        self._stored_read_at = now
        try:
            listed = store.schedule_list()
        except (MayflyError, OSError) as exc:
            self._note(
                f"read:{exc}", f"reading the journal's schedules failed: {exc}; serving the last ones read"
            )
            return
        stored = {entry.name: entry for entry in listed}
        for name, entry in stored.items():
            before = self._stored.get(name)
            if before is not None and before.version != entry.version and name in self._ticked:
                # Replaced: the new definition's ticks count from when it was stored, not since the old one's.
                self._ticked[name] = max(self._ticked[name], entry.updated_ms - 1)
        for name in set(self._stored) - set(stored):
            if all(code.name != name for code in self.schedules):
                self._ticked.pop(name, None)  # removed: stops firing; added again, it is new
        code_names = {code.name for code in self.schedules}
        for name in sorted(code_names & set(stored)):
            self._note(
                f"clash:{name}",
                f"schedule {name} is defined in the handlers code and stored in the journal; this worker "
                f"serves the code one; remove one of them (`{self.command} schedule remove {name} "
                f"--journal {shlex.quote(self.runtime.journal.url)}`)",
            )
        self._stored = {name: entry for name, entry in stored.items() if name not in code_names}

    def _note(self, key: str, message: str, **fields: Any) -> None:
        """Log a problem once (a schedule's, say: one that persists is not logged at every poll)."""
        if key not in self._notes:
            self._notes.add(key)
            self._emit("error", error=message, **fields)

    def _fire_schedules(self, default_ms: int) -> int:
        """Start the runs of due ticks; return the ms until the next tick (at most ``default_ms``)."""
        self._read_stored()
        served: list[tuple[Schedule, StoredSchedule | None]] = [(code, None) for code in self.schedules]
        served += [(entry.schedule, entry) for entry in self._stored.values()]
        if not served:
            return default_ms
        now = self.runtime._wall_ms()
        wait = default_ms
        for schedule, stored in served:
            if not self._fire(schedule, stored, now):
                return min(wait, 1_000)  # retried at the next turn, from the same tick
            wait = min(wait, max(1, schedule.next_after(now) - now))
        return wait

    def _fire(self, schedule: Schedule, stored: StoredSchedule | None, now: int) -> bool:
        """Start the schedule's due ticks; ``False`` if the store failed (to retry soon)."""
        name = schedule.name
        last = self._ticked.get(name)
        try:
            plan = schedule.plan(
                last,
                now,
                last_tick_ms=None if stored is None else stored.last_tick_ms,
                stored_ms=None if stored is None else stored.updated_ms,
            )
        except MayflyError as exc:
            self._note(f"plan:{name}", f"schedule {name}: {exc}", schedule=name)
            self._ticked[name] = now
            return True
        if plan.left_out:
            self._emit(
                "error",
                schedule=name,
                error=(
                    f"schedule {name}: more than {len(plan.ticks)} ticks were missed; catch_up 'all' starts "
                    f"the latest {len(plan.ticks)} (from {plan.ticks[0]}) and leaves the older ones out"
                ),
            )
        started = None
        for tick in plan.ticks:
            run_id = tick_run_id(name, tick)
            try:
                self.runtime.start(
                    schedule.spec, schedule.run_input(tick), run_id=run_id, queue=schedule.queue
                )
            except (JournalUnavailable, OSError) as exc:
                self._emit("error", error=f"schedule {name}: starting tick {tick} failed: {exc}")
                self._mark(stored, started)
                return False
            except MayflyError as exc:
                # The run cannot be made (a plugin refuses the spec, a corrupt run): this tick is given up.
                version = None if stored is None else stored.version
                self._note(
                    f"start:{name}:{version}:{type(exc).__name__}",
                    f"schedule {name}: the run of tick {tick} cannot be started ({exc}); its ticks are "
                    "skipped until the schedule is fixed",
                    schedule=name,
                )
            else:
                self._emit("scheduled", schedule=name, tick_ms=tick, run_id=run_id)
            self._ticked[name] = started = tick
        self._mark(stored, started)
        if name not in self._ticked:
            self._ticked[name] = now  # nothing was due: look from now on
        return True

    def _mark(self, stored: StoredSchedule | None, tick: int | None) -> None:
        """Record a stored schedule's last started tick (advisory: catch-up after downtime reads it)."""
        if stored is None or tick is None or self._schedule_store is None:
            return
        try:
            self._schedule_store.schedule_mark(stored.name, tick)
        except (MayflyError, OSError) as exc:
            self._emit("error", error=f"schedule {stored.name}: recording tick {tick} failed: {exc}")

    def _next_wake_in(self, default_ms: int) -> int:
        now = self.runtime._wall_ms()
        try:
            wake = self.index.next_wake(now_ms=now, queues=self.queues)
        except (JournalUnavailable, OSError):
            return default_ms
        return default_ms if wake is None else max(1, min(default_ms, wake - now))

    def _pause(self, ms: int) -> None:
        try:
            self._done.receive(timeout=ms / 1000)
        except WaitTimeout:
            return
        # Drain every notification already sent (tasks that ended, a stop).
        while len(self._done):
            self._done.receive()

    def _watch_signals(self, fd: int) -> None:
        while True:
            wait_readable(fd)
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                continue
            for _ in data:
                self._stops += 1
                if self._stops == 1:
                    self._emit("stopping", grace_ms=self.grace_ms, active=len(self._active))
                else:
                    self._emit("aborting", active=len(self._active))
            self._done.send(None)

    def _drain(self) -> None:
        """Let in-flight attempts finish within the grace period, then release every lease."""
        if self._stops == 1:
            for driver in list(self.runtime._drivers.values()):
                driver.request_drain()
            deadline = current_hub().now_ms() + self.grace_ms
            while self._active and self._stops == 1:
                left = deadline - current_hub().now_ms()
                if left <= 0:
                    break
                self._pause(left)
        for task in list(self._active.values()):
            task.cancel("worker stopping")
        for task in list(self._active.values()):
            with contextlib.suppress(MayflyError):
                task.join()
        wakeups = RUN_WAKEUPS.of(self.runtime.journal)
        if wakeups is not None:
            wakeups.notify_wakeups()  # what this worker let go is claimable by the others now
        self._emit("stopped", claimed=self.claimed, ended=self.ended)

    # -- one claimed run ---------------------------------------------------------------

    def _refuse(self, run_id: str) -> None:
        """Remember a run this worker will not drive; past ``_REFUSED_KEPT``, the oldest is forgotten.

        A long-lived worker in a fleet whose workers have different handlers
        would otherwise remember every run it ever refused; one it forgot is
        claimed and refused (and logged) once more if it is still there.
        """
        refused = self._refused
        refused[run_id] = None
        if len(refused) > _REFUSED_KEPT:
            del refused[next(iter(refused))]

    def _start(self, guard: RecoveryLeaseGuard, asked_ms: int) -> None:
        self.claimed += 1
        run_id = guard.run_id
        task: Task[None] = spawn(self._drive, guard, asked_ms, name=f"worker run {run_id}")
        self._active[run_id] = task

    def _drive(self, guard: RecoveryLeaseGuard, asked_ms: int) -> None:
        run_id = guard.run_id
        started = time.monotonic()
        try:
            self._drive_claimed(guard, started, asked_ms)
        finally:
            self._active.pop(run_id, None)
            self._queue_of.pop(run_id, None)
            self._done.send(None)

    def _drive_claimed(self, guard: RecoveryLeaseGuard, started: float, asked_ms: int) -> None:
        runtime = self.runtime
        run_id = guard.run_id
        try:
            session = resume_claimed(
                runtime.journal,
                guard,
                handler_available=runtime.registry.is_available,
                upcasters=runtime.upcasters,
            )
        except ResumeRefused as refused:
            self._refuse(run_id)
            self._emit("refused", run_id=run_id, error=str(refused))
            return
        except CorruptionError as exc:
            self._refuse(run_id)
            self._emit("error", run_id=run_id, error=f"run {run_id} is unreadable and left alone: {exc}")
            return
        except (JournalUnavailable, OSError) as exc:
            self._emit("error", run_id=run_id, error=f"could not load run {run_id}: {exc}")
            return
        with session:
            state = session.state
            loaded = state.sequence  # the driver may advance ``state`` itself
            notify_recovery(runtime.observer, state, session.effects)
            self._queue_of[run_id] = state.queue
            self._emit("claimed", run_id=run_id, queue=state.queue, status=state.status.value)
            # A stopping worker claims nothing; one that claimed just before it stopped hands over at once.
            driver = RunDriver(
                runtime._context(),
                state,
                lease=session.lease,
                concurrent=True,
                detach_on_wait=True,
                drivers=runtime._drivers,
                detach_after_ms=self.poll_interval_ms,
                lease_asked_ms=asked_ms,
            )
            if self._stops:
                driver.request_drain()
            runtime._drivers[run_id] = driver
            try:
                final = driver.drive(session.effects)
            except (LeaseLost, FencingRejected) as lost:
                self._emit("lost", run_id=run_id, error=f"run {run_id} let go: {lost}")
                return
            except (JournalUnavailable, OSError) as exc:
                self._emit("error", run_id=run_id, error=f"run {run_id} stopped on a store error: {exc}")
                return
            finally:
                runtime._drivers.pop(run_id, None)
            elapsed = time.monotonic() - started
            self._settle_entry(driver, final, appended=final.sequence != loaded)
            if final.status.is_terminal:
                self.ended += 1
                self._emit("ended", run_id=run_id, status=final.status.value, seconds=round(elapsed, 3))
                return
            self._emit("parked", run_id=run_id, waiting=sorted(driver.waits()), seconds=round(elapsed, 3))

    def _settle_entry(self, driver: RunDriver, state: RunState, *, appended: bool) -> None:
        """Leave the ended or detached run with its true entry; most often its last append wrote it.

        A run whose only work is parked children waits for them. A run the
        driver appended nothing to since the claim gets its entry put: the
        stored one may be the runnable entry a crash left after the run's last
        frames, which would otherwise be claimed on every poll.
        """
        children = () if state.status.is_terminal else driver.children.parked_runs()
        if children:
            wakes = [entry.ready_at_ms for entry in self._entries(children) if entry.ready_at_ms is not None]
            self.index.index_put([index_entry(state, parked=True, parked_until=min(wakes, default=None))])
        elif not appended:
            self.index.index_put([index_entry(state)])

    def _entries(self, run_ids: Iterable[str]) -> list[Any]:
        entries = []
        for run_id in run_ids:
            entry = self.index.index_get(run_id)
            if entry is not None:
                entries.append(entry)
        return entries

    def _check_index(self) -> None:
        """Warn if the store's oldest run has no index entry: runs from before the index are unfindable."""
        try:
            oldest = self.runtime.journal.list_runs(limit=1)
            missing = bool(oldest) and self.index.index_get(oldest[0]) is None
        except (JournalUnavailable, OSError):
            return  # the claim loop reports an unreachable store
        if missing:
            self._emit(
                "index_incomplete",
                run_id=oldest[0],
                error=(
                    f"run {oldest[0]} has no run index entry: this store holds runs written before its "
                    f"index, which no worker can find; run `{self.command} index rebuild "
                    f"--journal {shlex.quote(self.runtime.journal.url)}`"
                ),
            )

    def _emit(self, event: str, **fields: Any) -> None:
        kind = WorkerEvent.of(event)
        self._events[kind] = self._events.get(kind, 0) + 1
        self._log({"event": event, "worker": self.owner, **fields})

    def metrics(self) -> WorkerMetrics:
        """This worker's in-process counters: events by kind (claims, lease losses, ...), active runs.

        Serve them with :func:`mayfly.telemetry.prometheus.render_worker`; they
        count this process only (docs/telemetry.md).
        """
        return WorkerMetrics(
            events=dict(self._events), active=len(self._active), concurrency=self.concurrency
        )


def _text_log(stream: TextIO) -> Callable[[dict[str, Any]], None]:
    def write(record: dict[str, Any]) -> None:
        event = record["event"]
        run = record.get("run_id")
        if event == "claimed":
            line = f"claimed run {run} (queue {record['queue']})"
        elif event == "ended":
            line = f"run {run} {record['status']} ({record['seconds']} s in this worker)"
        elif event == "parked":
            waits = ", ".join(record["waiting"]) or "a timer"
            line = f"run {run} parked on {waits}"
        elif event == "scheduled":
            line = f"schedule {record['schedule']}: run {run} for the tick at {record['tick_ms']}"
        elif event == "started":
            queues = ", ".join(record["queues"])
            line = f"worker {record['worker']} started: concurrency {record['concurrency']}, queues {queues}"
        elif event == "stopping":
            line = f"stopping: no new claims; {record['active']} run(s) get {record['grace_ms']} ms to finish"
        elif event == "aborting":
            line = f"aborting: {record['active']} run(s) left in flight for the next worker"
        elif event == "stopped":
            line = f"worker stopped ({record['claimed']} claim(s), {record['ended']} run(s) ended)"
        else:
            line = record.get("error", event)
        stream.write(f"mayfly worker: {line}\n")
        stream.flush()

    return write


def json_log(stream: TextIO) -> Callable[[dict[str, Any]], None]:
    """A ``log`` for :class:`Worker` writing one JSON object per line (``mayfly worker --json``)."""

    def write(record: dict[str, Any]) -> None:
        stream.write(json.dumps(record, sort_keys=True) + "\n")
        stream.flush()

    return write
