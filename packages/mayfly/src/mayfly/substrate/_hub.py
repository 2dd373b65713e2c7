"""The greenlet hub: Mayfly's only scheduler (ADR-0033, with May's runtime played by this hub).

One hub runs per thread, driven by :meth:`Hub.run`. It owns a FIFO ready queue
of greenlet tasks, a timer heap, one ``selectors`` selector for fd readiness
and offload completions, and the offload pool. A task runs until it parks
(sleep, join, event, channel, fd wait, offload, checkpoint); nothing else ever
switches greenlets, so exactly one task runs at a time.

Parking is token-based: every park gives the task a fresh token, and a wake
that carries a stale token (a timer that lost the race to an event, a late
offload completion) is ignored. That one rule makes timeouts, cancellation and
late results safe without removing anything from the middle of a structure.

Cancellation is cooperative and level-triggered: once a task is cancelled,
every park point it reaches raises :class:`TaskCancelled`, so a handler that
swallows the exception once cannot keep the task alive past its next park.

Hub objects (tasks, events, channels) belong to the hub's thread: only code
running on it may cancel, set, send or wait. Another thread (an offloaded
call, a signal handler's helper) talks to the hub by returning from
:func:`offload`, e.g. a task parked in ``offload(stop.wait)`` on a
``threading.Event`` that the other side sets.
"""

from __future__ import annotations

import contextlib
import functools
import math
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, Protocol, TypeVar, final

import greenlet  # type: ignore[import-untyped,unused-ignore]  # greenlet ships no stubs here
import msgspec

from mayfly.model.errors import (
    Deadlock,
    HubAlreadyRunning,
    HubNotRunning,
    LimitExceeded,
    OffloadTimeout,
    SubstrateError,
    TaskCancelled,
    TaskFailed,
    TaskNotDone,
    WaitTimeout,
)
from mayfly.substrate._clock import Clock, RealClock, VirtualClock
from mayfly.substrate._offload import Job, OffloadPool
from mayfly.substrate._timers import TimerHeap

if TYPE_CHECKING:
    from mayfly.substrate._sync import Channel

__all__ = [
    "FAILURE_MESSAGE_LIMIT",
    "CancellationHandle",
    "HasFileno",
    "Hub",
    "HubStats",
    "Task",
    "checkpoint",
    "current_hub",
    "current_task",
    "now_ms",
    "offload",
    "sleep",
    "sleep_until",
    "spawn",
    "wait_fd",
    "wait_readable",
    "wait_writable",
]

T = TypeVar("T")
P = ParamSpec("P")

FAILURE_MESSAGE_LIMIT = 4096
"""Bytes of UTF-8 kept from a failed task's message, and allowed in a cancel reason (4 KiB)."""

_SHUTDOWN_ROUNDS = 1000  # ready-queue rounds granted to cancelled tasks before they are killed
# Finished tasks hand their greenlet to the next task: starting a fresh greenlet
# costs an order of magnitude more than a switch. Idle ones beyond this are freed.
_IDLE_GREENLETS = 256
_SHUTDOWN_REASON = "the hub is shutting down"


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


# Private wake values: user code cannot send these, so they never collide with an item.
_TIMED_OUT: Any = _Marker("TIMED_OUT")
_CANCELLED: Any = _Marker("CANCELLED")
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE

_NEW, _LIVE, _OK, _FAILED, _CANCELLED_STATE = range(5)

_local = threading.local()


class HasFileno(Protocol):
    """Anything with a ``fileno()``: sockets, files, driver connections."""

    def fileno(self) -> int:
        """Return the OS file descriptor."""
        ...


@final
class HubStats(msgspec.Struct, frozen=True):
    """Counters of one hub run, for benchmarks and telemetry."""

    tasks_spawned: int
    switches: int
    timers_fired: int
    offloads_completed: int
    offloads_discarded: int
    offload_threads_started: int


@final
class CancellationHandle:
    """A read-only view of a task's cancellation: handlers can observe it, never trigger it."""

    __slots__ = ("_reason",)

    def __init__(self) -> None:
        self._reason: str | None = None

    @property
    def is_cancelled(self) -> bool:
        """Whether cancellation has been requested."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the task was cancelled, or ``None`` while it is not."""
        return self._reason

    def __repr__(self) -> str:
        return f"CancellationHandle(reason={self._reason!r})"


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _bounded_message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure itself
        text = f"<unprintable {type(exc).__qualname__}>"
    raw = text.encode("utf-8", "replace")
    if len(raw) <= FAILURE_MESSAGE_LIMIT:
        return text
    return raw[:FAILURE_MESSAGE_LIMIT].decode("utf-8", "ignore")


@final
class Task(Generic[T]):
    """A greenlet scheduled by a hub; create one with :func:`spawn`, never directly."""

    __slots__ = (
        "__weakref__",
        "_cancellation",
        "_error",
        "_fn",
        "_glet",
        "_hub",
        "_joiners",
        "_name",
        "_notify",
        "_parked",
        "_result",
        "_state",
        "_token",
    )

    def __init__(self, hub: Hub, fn: Callable[[], T], name: str, notify: Channel[Task[Any]] | None) -> None:
        self._hub = hub
        self._fn: Callable[[], T] | None = fn
        self._name = name
        self._notify = notify
        self._glet: greenlet.greenlet | None = None  # a pooled worker greenlet, from first run to finish
        self._state = _NEW
        self._result: T | None = None
        self._error: BaseException | None = None
        self._cancellation = CancellationHandle()
        self._joiners: dict[Task[Any], int] | None = None
        self._parked = False
        self._token = 0

    @property
    def name(self) -> str:
        """The task's name, used in errors and deadlock reports."""
        return self._name

    @property
    def done(self) -> bool:
        """Whether the task has finished (returned, failed or was cancelled)."""
        return self._state > _LIVE

    @property
    def cancellation(self) -> CancellationHandle:
        """The read-only cancellation handle to pass to handlers."""
        return self._cancellation

    def cancel(self, reason: str) -> None:
        """Request cancellation: the task gets ``TaskCancelled`` at its current or next park point.

        A parked task is woken at once. The first reason wins; cancelling a
        finished task does nothing. The reason is recorded durably, so it must
        be a string of at most 4 KiB of UTF-8 (``LimitExceeded`` otherwise).
        """
        if not isinstance(reason, str):
            raise TypeError(f"cancellation reason must be a str, got {type(reason).__name__}")
        size = len(reason.encode("utf-8", "surrogatepass"))
        if size > FAILURE_MESSAGE_LIMIT:
            raise LimitExceeded(f"cancellation reason of task {self._name!r}", FAILURE_MESSAGE_LIMIT, size)
        if self._state > _LIVE or self._cancellation._reason is not None:
            return
        self._cancellation._reason = reason
        if self._parked:
            self._hub._wake(self, self._token, _CANCELLED)

    def result(self) -> T:
        """Return the task's result, or raise ``TaskFailed``/``TaskCancelled``/``TaskNotDone``."""
        if self._state == _OK:
            return self._result  # type: ignore[return-value]  # set together with _OK
        failure = self.exception()
        if failure is None:
            raise TaskNotDone(f"task {self._name!r} has not finished; join it before asking for its result")
        raise failure

    def exception(self) -> TaskFailed | TaskCancelled | None:
        """Return how the task ended abnormally (``None`` if it returned); raise if it runs."""
        if self._state == _OK:
            return None
        if self._state == _CANCELLED_STATE:
            return TaskCancelled(self._name, self._cancellation._reason or _SHUTDOWN_REASON)
        if self._state == _FAILED:
            error = self._error
            assert error is not None  # set together with _FAILED
            failure = TaskFailed(self._name, _error_type(error), _bounded_message(error))
            failure.__cause__ = error
            return failure
        raise TaskNotDone(f"task {self._name!r} has not finished; join it before asking for its outcome")

    def join(self, timeout: float | None = None) -> T:
        """Park the calling task until this one finishes; return its result or raise its failure.

        Raises ``WaitTimeout`` if it has not finished within ``timeout`` seconds.
        """
        if self._state <= _LIVE:
            hub = self._hub
            me = hub._caller("Task.join")
            if me is self:
                raise SubstrateError(f"task {self._name!r} cannot join itself: it would never finish")
            deadline = hub._deadline(timeout)  # validate before parking
            token = hub._arm(me)
            joiners = self._joiners
            if joiners is None:
                joiners = self._joiners = {}
            joiners[me] = token
            try:
                value = hub._suspend(me, token, deadline)
            finally:
                joiners.pop(me, None)
            if value is _TIMED_OUT:
                raise WaitTimeout(f"task {self._name!r} did not finish within {timeout} s (join)")
        return self.result()

    def __repr__(self) -> str:
        state = ("new", "live", "ok", "failed", "cancelled")[self._state]
        return f"<Task {self._name!r} {state}>"

    def _execute(self) -> None:
        """Run the task's function to its end on the current worker greenlet; never raises."""
        hub = self._hub
        self._state = _LIVE
        fn, self._fn = self._fn, None
        try:
            if self._cancellation._reason is not None or fn is None:
                # Cancelled before it ever ran: the function is never started.
                self._state = _CANCELLED_STATE
            else:
                self._result = fn()
                self._state = _OK
        except TaskCancelled as exc:
            if self._cancellation._reason is not None:
                self._state = _CANCELLED_STATE
            else:  # another task's cancellation escaped through join: a failure of this task
                self._error = exc
                self._state = _FAILED
        except greenlet.GreenletExit:
            if self._cancellation._reason is None:
                self._cancellation._reason = _SHUTDOWN_REASON
            self._state = _CANCELLED_STATE
        except Exception as exc:  # surfaced as TaskFailed on join
            self._error = exc
            self._state = _FAILED
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: stop the hub and re-raise
            self._error = exc
            self._state = _FAILED
            hub._fatal = exc
        finally:
            del fn
            self._glet = None
            hub._finished(self)


class _FdWait:
    __slots__ = ("reader", "reader_token", "writer", "writer_token")

    def __init__(self) -> None:
        self.reader: Task[Any] | None = None
        self.reader_token = 0
        self.writer: Task[Any] | None = None
        self.writer_token = 0

    def mask(self) -> int:
        return (selectors.EVENT_READ if self.reader is not None else 0) | (
            selectors.EVENT_WRITE if self.writer is not None else 0
        )


@final
class Hub:
    """The single execution owner: runs greenlet tasks, timers, fd readiness and offloaded calls.

    ``Hub(clock, offload_workers=8)`` is driven by :meth:`run`; a hub can be run
    again after a run ends, but only one hub runs per thread at a time.

    With a :class:`VirtualClock`, time jumps to the next timer only when every
    task is parked and no offloaded call or fd wait is in flight; while one is,
    the hub waits for it in real time, so the timeout of an offload or fd wait
    cannot fire before the call or fd itself completes.

    ``on_hog(task_name, ms)`` is told whenever one task runs for more than
    ``hog_ms`` without parking: nothing else runs meanwhile — no timer, no
    lease renewal, no other run — so a cooperative handler that computes for
    seconds is diagnosed by name instead of silently starving the hub.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        offload_workers: int = 8,
        shutdown_timeout: float = 5.0,
        hog_ms: int | None = None,
        on_hog: Callable[[str, int], None] | None = None,
    ) -> None:
        if offload_workers < 1:
            raise ValueError(f"offload_workers must be at least 1, got {offload_workers}")
        if shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {shutdown_timeout}")
        self._clock: Clock = clock if clock is not None else RealClock()
        self._virtual = isinstance(self._clock, VirtualClock)
        self._offload_workers = offload_workers
        self._shutdown_timeout = shutdown_timeout
        self._hog_ns = None if hog_ms is None or on_hog is None else hog_ms * 1_000_000
        self._on_hog = on_hog
        self._running = False
        self._reset()

    def _reset(self) -> None:
        self._hub_glet: greenlet.greenlet | None = None
        self._ready: deque[tuple[Task[Any], Any]] = deque()
        self._idle: list[greenlet.greenlet] = []
        self._timers = TimerHeap()
        self._tasks: dict[Task[Any], None] = {}
        self._current: Task[Any] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._pool: OffloadPool | None = None
        self._fd_waits: dict[int, _FdWait] = {}
        self._offload_waiters = 0
        self._fatal: BaseException | None = None
        self._closing = False
        self._task_counter = 0
        self._switches = 0
        self._timers_fired = 0
        self._offloads_completed = 0
        self._offloads_discarded = 0
        self._threads_started = 0
        self._leaked_threads: list[str] = []

    # ----------------------------------------------------------------- public

    @property
    def clock(self) -> Clock:
        """The clock this hub reads time from."""
        return self._clock

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is in progress."""
        return self._running

    def now_ms(self) -> int:
        """Return the hub clock's current time in milliseconds."""
        return self._clock.now_ms()

    def stats(self) -> HubStats:
        """Return the counters of the current (or last) run."""
        pool = self._pool
        return HubStats(
            tasks_spawned=self._task_counter,
            switches=self._switches,
            timers_fired=self._timers_fired,
            offloads_completed=self._offloads_completed,
            offloads_discarded=self._offloads_discarded,
            offload_threads_started=pool.threads_started if pool else self._threads_started,
        )

    @property
    def leaked_threads(self) -> tuple[str, ...]:
        """Offload threads of the last run still blocked in a call when shutdown gave up."""
        return tuple(self._leaked_threads)

    def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` as the main task on this thread until it ends; return its result or re-raise.

        When the main task ends, every other task is cancelled and joined, and
        the offload pool is stopped. A thread cannot be killed: an offloaded
        call still blocking then keeps its daemon thread until it returns (its
        result is dropped); the hub waits ``shutdown_timeout`` seconds for such
        threads and names those still alive in :attr:`leaked_threads`.

        Raises ``Deadlock`` if every task parks with nothing left to wake it,
        ``HubAlreadyRunning`` if this thread (or this hub) already runs a hub.
        """
        if getattr(_local, "hub", None) is not None:
            raise HubAlreadyRunning(
                "Hub.run() called while a hub is already running on this thread; "
                "spawn a task on the running hub instead of nesting hubs"
            )
        if self._running:
            raise HubAlreadyRunning(
                "this Hub is already running on another thread; create one Hub per thread"
            )
        self._reset()
        self._running = True
        _local.hub = self
        try:
            self._hub_glet = greenlet.getcurrent()
            try:
                self._selector = selectors.DefaultSelector()
                self._wake_r, self._wake_w = socket.socketpair()
                self._wake_r.setblocking(False)
                self._wake_w.setblocking(False)
                self._selector.register(self._wake_r, selectors.EVENT_READ, None)
                self._pool = OffloadPool(self._offload_workers, self._notify_from_thread)
                call: Callable[[], T] = functools.partial(fn, *args, **kwargs)
                main = self._spawn(call, "main", None)
                self._loop(main)
            finally:
                self._shutdown()
        finally:
            _local.hub = None
            self._running = False
        if self._fatal is not None:
            raise self._fatal
        if main._state == _FAILED:
            assert main._error is not None
            raise main._error
        return main.result()

    def spawn(
        self,
        fn: Callable[..., T],
        *args: object,
        name: str | None = None,
        notify: Channel[Task[Any]] | None = None,
    ) -> Task[T]:
        """Start ``fn(*args)`` as a new task, queued behind every task already ready.

        With ``notify``, the finished task is sent on that channel, so one
        receiver can wait for whichever of many tasks finishes first.
        """
        if _local_hub() is not self:
            raise HubNotRunning("Hub.spawn")
        call: Callable[[], T] = functools.partial(fn, *args) if args else fn
        return self._spawn(call, name, notify)

    # --------------------------------------------------------------- internal

    def _spawn(self, call: Callable[[], T], name: str | None, notify: Channel[Task[Any]] | None) -> Task[T]:
        self._task_counter += 1
        task = Task(self, call, name if name is not None else f"task-{self._task_counter}", notify)
        if self._closing:
            task._cancellation._reason = _SHUTDOWN_REASON
        self._tasks[task] = None
        self._ready.append((task, None))
        return task

    def _finished(self, task: Task[Any]) -> None:
        self._tasks.pop(task, None)
        joiners = task._joiners
        if joiners:
            task._joiners = None
            for joiner, token in joiners.items():
                self._wake(joiner, token, None)
        if task._notify is not None:
            task._notify.send(task)
            task._notify = None

    def _caller(self, operation: str) -> Task[Any]:
        """Return the running task, checking it belongs to this hub and is the current greenlet."""
        if _local_hub() is not self:
            if _local_hub() is None:
                raise HubNotRunning(operation)
            raise SubstrateError(
                f"{operation}: the task belongs to another hub than the one running on this thread"
            )
        task = self._current
        if task is None or task._glet is not greenlet.getcurrent():
            raise SubstrateError(
                f"{operation}() called from a greenlet the hub does not own; "
                "park only from tasks started with spawn() or Hub.run()"
            )
        return task

    def _deadline(self, timeout: float | None) -> int | None:
        if timeout is None:
            return None
        if not timeout >= 0:  # also rejects NaN
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        return self._clock.now_ms() + math.ceil(timeout * 1000)

    def _arm(self, task: Task[Any]) -> int:
        """Begin a park: hand out the token wakers must present, or raise if the task is cancelled."""
        reason = task._cancellation._reason
        if reason is not None:
            # Yield once before raising, so a task that swallows cancellation in
            # a loop still lets the hub run (and eventually stop) everything else.
            self._ready.append((task, None))
            assert self._hub_glet is not None
            self._hub_glet.switch()
            raise TaskCancelled(task._name, reason)
        task._token += 1
        task._parked = True
        return task._token

    def _suspend(self, task: Task[Any], token: int, deadline_ms: int | None) -> Any:
        """Switch to the hub until woken; return the wake value (``_TIMED_OUT`` on deadline)."""
        timer = None
        if deadline_ms is not None:
            timer = self._timers.push(deadline_ms, task, token)
        try:
            assert self._hub_glet is not None
            value = self._hub_glet.switch()
        finally:
            task._parked = False
            if timer is not None:
                self._timers.cancel(timer)
        if value is _CANCELLED:
            raise TaskCancelled(task._name, task._cancellation._reason or _SHUTDOWN_REASON)
        return value

    def _wake(self, task: Task[Any], token: int, value: Any) -> bool:
        if task._token != token or not task._parked:
            return False  # a stale wake: that park already ended
        task._parked = False
        self._ready.append((task, value))
        return True

    def _notify_from_thread(self) -> None:
        # Called on worker threads: a full socket buffer already means "wake up".
        wake_w = self._wake_w
        if wake_w is None:
            return
        with contextlib.suppress(OSError):
            wake_w.send(b"\0")

    def _run_ready(self) -> None:
        ready = self._ready
        closing = self._closing
        # Only the tasks ready now: tasks readied meanwhile wait for the next
        # round, so timers and I/O get their turn between rounds.
        for _ in range(len(ready)):
            task, value = ready.popleft()
            glet = task._glet
            if glet is None:  # first run: lend it a worker greenlet
                if task._state != _NEW:
                    continue
                if self._idle:
                    glet = self._idle.pop()
                    glet.gr_context = None  # a fresh, empty contextvars context, as a new greenlet has
                else:
                    glet = greenlet.greenlet(self._worker, self._hub_glet)
                task._glet = glet
                value = task
            self._current = task
            self._switches += 1
            hog_ns = self._hog_ns
            started = time.monotonic_ns() if hog_ns is not None else 0
            try:
                glet.switch(value)
            finally:
                self._current = None
            if hog_ns is not None:
                held = time.monotonic_ns() - started
                if held > hog_ns and self._on_hog is not None:
                    self._on_hog(task.name, held // 1_000_000)
            if self._fatal is not None and not closing:
                raise self._fatal

    def _worker(self, task: Task[Any]) -> None:
        """Body of a pooled greenlet: run one task after another until the pool is full or closing."""
        me = greenlet.getcurrent()
        while True:
            task._execute()
            if self._closing or len(self._idle) >= _IDLE_GREENLETS:
                return
            self._idle.append(me)
            assert self._hub_glet is not None
            task = self._hub_glet.switch()

    def _loop(self, main: Task[Any]) -> None:
        while True:
            self._run_ready()
            if main._state > _LIVE:
                return
            self._poll()

    def _io_pending(self) -> bool:
        return bool(self._fd_waits) or self._offload_waiters > 0

    def _fire_timers(self) -> None:
        now = self._clock.now_ms()
        timers = self._timers
        while (timer := timers.pop_due(now)) is not None:
            self._timers_fired += 1
            self._wake(timer.owner, timer.token, _TIMED_OUT)  # type: ignore[arg-type]  # owners are tasks

    def _poll(self) -> None:
        """Fire due timers and collect I/O; block only when no task is ready."""
        self._fire_timers()
        io_pending = self._io_pending()
        timeout: float | None
        if self._ready:
            if not io_pending:
                return
            timeout = 0.0
        else:
            deadline = self._timers.next_deadline()
            if self._virtual and not io_pending:
                if deadline is None:
                    self._deadlock()
                clock = self._clock
                assert isinstance(clock, VirtualClock) and deadline is not None
                if deadline > clock.now_ms():
                    clock.advance_to(deadline)
                self._fire_timers()
                return
            if deadline is None:
                if not io_pending:
                    self._deadlock()
                timeout = None
            elif self._virtual:
                timeout = None  # virtual time stands still while real I/O is in flight
            else:
                timeout = max(0, deadline - self._clock.now_ms()) / 1000
        assert self._selector is not None
        for key, mask in self._selector.select(timeout):
            wait = key.data
            if wait is None:
                self._drain_offloads()
                continue
            reader, writer = wait.reader, wait.writer
            if reader is not None and reader is writer and wait.reader_token == wait.writer_token:
                self._wake(reader, wait.reader_token, mask & (_READ | _WRITE))  # one task, both ways
                continue
            if mask & _READ and reader is not None:
                self._wake(reader, wait.reader_token, _READ)
            if mask & _WRITE and writer is not None:
                self._wake(writer, wait.writer_token, _WRITE)
        self._fire_timers()

    def _drain_offloads(self) -> None:
        assert self._wake_r is not None and self._pool is not None
        # One read: bytes left over (a burst of over 4096 completions) only make
        # the next select return at once, which drains them.
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        for job in self._pool.drain():
            if job.abandoned or not self._wake(job.owner, job.token, job):  # type: ignore[arg-type]  # owners are tasks
                self._offloads_discarded += 1
            else:
                self._offloads_completed += 1

    def _deadlock(self) -> NoReturn:
        parked = [task._name for task in self._tasks if task._parked]
        raise Deadlock(parked)

    def _shutdown(self) -> None:
        self._closing = True
        try:
            for task in list(self._tasks):
                task.cancel(_SHUTDOWN_REASON)
            rounds = 0
            while self._tasks and self._ready and rounds < _SHUTDOWN_ROUNDS:
                rounds += 1
                self._run_ready()
            for task in list(self._tasks):
                # It swallowed cancellation or never got to run: end it by force.
                if task._glet:
                    self._current = task
                    try:
                        task._glet.throw(greenlet.GreenletExit)
                    finally:
                        self._current = None
                if task in self._tasks:
                    task._state = _CANCELLED_STATE
                    self._finished(task)
            idle, self._idle = self._idle, []
            for glet in idle:
                glet.throw(greenlet.GreenletExit)  # ends the worker loop; the greenlet dies
        finally:
            self._ready.clear()
            self._timers.clear()
            self._fd_waits.clear()
            if self._pool is not None:
                self._threads_started = self._pool.threads_started
                self._leaked_threads = self._pool.shutdown(self._shutdown_timeout)
            if self._selector is not None:
                self._selector.close()
            wake_w, self._wake_w = self._wake_w, None
            for sock in (self._wake_r, wake_w):
                if sock is not None:
                    sock.close()
            self._hub_glet = None

    # ----------------------------------------------------- park-point bodies

    def _sleep_until(self, deadline_ms: int) -> None:
        if deadline_ms <= self._clock.now_ms():
            self._checkpoint("sleep")  # already due: just yield once
            return
        task = self._caller("sleep")
        self._suspend(task, self._arm(task), deadline_ms)

    def _checkpoint(self, operation: str = "checkpoint") -> None:
        task = self._caller(operation)
        self._arm(task)
        task._parked = False
        self._ready.append((task, None))
        assert self._hub_glet is not None
        self._hub_glet.switch()
        reason = task._cancellation._reason
        if reason is not None:
            raise TaskCancelled(task._name, reason)

    def _offload(self, fn: Callable[..., T], args: tuple[Any, ...], timeout: float | None) -> T:
        task = self._caller("offload")
        deadline = self._deadline(timeout)
        token = self._arm(task)
        job = Job(fn, args, task, token)
        assert self._pool is not None
        try:
            self._pool.submit(job)
        except BaseException:
            task._parked = False  # never suspended: leave no park behind
            raise
        self._offload_waiters += 1
        try:
            value = self._suspend(task, token, deadline)
        except BaseException:
            job.abandoned = True
            raise
        finally:
            self._offload_waiters -= 1
        if value is not job:
            job.abandoned = True
            name = getattr(fn, "__qualname__", repr(fn))
            raise OffloadTimeout(
                f"offloaded call {name} in task {task._name!r} did not finish within {timeout} s; "
                "its thread keeps running and its late result will be discarded"
            )
        error, job.error = job.error, None
        if error is not None:
            raise error
        result: T = job.result
        job.result = None
        return result

    def _wait_fd(self, operation: str, fileobj: int | HasFileno, events: int, timeout: float | None) -> int:
        task = self._caller(operation)
        if events not in (_READ, _WRITE, _READ | _WRITE):
            raise ValueError(
                f"{operation}: events must be EVENT_READ, EVENT_WRITE or both (1, 2 or 3), got {events!r}"
            )
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        deadline = self._deadline(timeout)
        selector = self._selector
        assert selector is not None
        wait = self._fd_waits.get(fd)
        if wait is not None:
            for direction, holder in ((_READ, wait.reader), (_WRITE, wait.writer)):
                if events & direction and holder is not None:
                    raise SubstrateError(
                        f"{operation}: fd {fd} is already awaited by task {holder._name!r}; "
                        "use one connection per task"
                    )
        token = self._arm(task)
        fresh = wait is None
        if wait is None:
            wait = _FdWait()
        self._set_waiters(wait, events, task, token)
        try:
            if fresh:
                selector.register(fd, wait.mask(), wait)
                self._fd_waits[fd] = wait
            else:
                selector.modify(fd, wait.mask(), wait)
        except BaseException:
            task._parked = False  # never suspended: leave no park behind
            self._set_waiters(wait, events, None, 0)
            if not fresh:
                self._refresh_fd(fd, wait)
            raise
        try:
            value = self._suspend(task, token, deadline)
        finally:
            self._set_waiters(wait, events, None, 0)
            self._refresh_fd(fd, wait)
        if value is _TIMED_OUT:
            what = {_READ: "readable", _WRITE: "writable"}.get(events, "readable or writable")
            raise WaitTimeout(f"fd {fd} did not become {what} within {timeout} s (task {task._name!r})")
        ready: int = value
        return ready

    def _refresh_fd(self, fd: int, wait: _FdWait) -> None:
        selector = self._selector
        if selector is None or self._fd_waits.get(fd) is not wait:
            return
        mask = wait.mask()
        try:
            if mask:
                selector.modify(fd, mask, wait)
                return
        except (OSError, ValueError):
            pass  # the fd was closed under us: forget it below
        del self._fd_waits[fd]
        with contextlib.suppress(KeyError, OSError, ValueError):
            selector.unregister(fd)

    @staticmethod
    def _set_waiters(wait: _FdWait, events: int, task: Task[Any] | None, token: int) -> None:
        if events & _READ:
            wait.reader, wait.reader_token = task, token
        if events & _WRITE:
            wait.writer, wait.writer_token = task, token


def _local_hub() -> Hub | None:
    hub: Hub | None = getattr(_local, "hub", None)
    return hub


def current_hub() -> Hub:
    """Return the hub running on this thread; ``HubNotRunning`` outside one."""
    hub = _local_hub()
    if hub is None:
        raise HubNotRunning("current_hub")
    return hub


def _running(operation: str) -> Hub:
    hub = _local_hub()
    if hub is None:
        raise HubNotRunning(operation)
    return hub


def current_task() -> Task[Any]:
    """Return the task that is running now; ``HubNotRunning`` outside a hub."""
    return _running("current_task")._caller("current_task")


def spawn(
    fn: Callable[..., T],
    *args: object,
    name: str | None = None,
    notify: Channel[Task[Any]] | None = None,
) -> Task[T]:
    """Start ``fn(*args)`` as a new task on the running hub (see :meth:`Hub.spawn`)."""
    return _running("spawn").spawn(fn, *args, name=name, notify=notify)


def now_ms() -> int:
    """Return the running hub's clock time in integer milliseconds."""
    return _running("now_ms").now_ms()


def sleep(seconds: float) -> None:
    """Park the calling task for ``seconds`` (rounded up to whole milliseconds); 0 just yields."""
    hub = _running("sleep")
    if not seconds >= 0:  # also rejects NaN
        raise ValueError(f"sleep length must be a non-negative number of seconds, got {seconds!r}")
    hub._sleep_until(hub.now_ms() + math.ceil(seconds * 1000))


def sleep_until(deadline_ms: int) -> None:
    """Park the calling task until the hub clock reaches ``deadline_ms``; a past one just yields."""
    _running("sleep_until")._sleep_until(deadline_ms)


def checkpoint() -> None:
    """Let every other ready task run once; raise ``TaskCancelled`` if this task was cancelled."""
    _running("checkpoint")._checkpoint()


def offload(fn: Callable[..., T], *args: object, timeout: float | None = None) -> T:
    """Run blocking ``fn(*args)`` on an offload thread while the calling task parks; return it.

    Exceptions from ``fn`` are re-raised in the task. On ``timeout`` the task
    gets ``OffloadTimeout``; on cancellation ``TaskCancelled``. The thread
    cannot be killed, so the call runs on and its late result is discarded.
    """
    return _running("offload")._offload(fn, args, timeout)


def wait_readable(fileno: int | HasFileno, timeout: float | None = None) -> None:
    """Park the calling task until ``fileno`` is readable; ``WaitTimeout`` after ``timeout`` s."""
    _running("wait_readable")._wait_fd("wait_readable", fileno, _READ, timeout)


def wait_writable(fileno: int | HasFileno, timeout: float | None = None) -> None:
    """Park the calling task until ``fileno`` is writable; ``WaitTimeout`` after ``timeout`` s."""
    _running("wait_writable")._wait_fd("wait_writable", fileno, _WRITE, timeout)


def wait_fd(fileno: int | HasFileno, events: int, timeout: float | None = None) -> int:
    """Park until ``fileno`` is ready for any of ``events``; return the ready subset of them.

    ``events`` is ``selectors.EVENT_READ`` (1), ``EVENT_WRITE`` (2) or both (3),
    the same bits as psycopg's ``Wait``/``Ready``; ``WaitTimeout`` after ``timeout`` s.
    """
    return _running("wait_fd")._wait_fd("wait_fd", fileno, events, timeout)
