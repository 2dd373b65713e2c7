"""The offload pool: the one place in Mayfly allowed to create OS threads.

Blocking calls cross into this bounded pool so they cannot freeze the hub's
timers, deadlines or cancellation (ARCHITECTURE section 7). Workers are
started lazily, at most ``max_workers``, named ``mayfly-offload-N``. A worker
hands each finished job back on a queue and writes one byte to the hub's wake
socket, so completions reach the hub through its selector and nothing polls.

A thread cannot be killed: a call that is cancelled or times out keeps running
in its worker until it returns, and its late result is discarded by the hub.
A job abandoned before a worker picked it up is never started.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, final

__all__ = ["Job", "OffloadPool"]


@final
class Job:
    """One offloaded call, and the parked task (``owner`` at park ``token``) waiting for it."""

    __slots__ = ("abandoned", "args", "error", "fn", "owner", "ran", "result", "token")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], owner: object, token: int):
        self.fn: Callable[..., Any] | None = fn
        self.args: tuple[Any, ...] = args
        self.owner = owner
        self.token = token
        self.result: Any = None
        self.error: BaseException | None = None
        # Written by the hub thread, read by a worker: a stale read only means
        # an abandoned call still runs, and its result is discarded anyway.
        self.abandoned = False
        self.ran = False


_STOP = None


@final
class OffloadPool:
    """A bounded pool of worker threads, started lazily and joined (bounded) at shutdown."""

    __slots__ = ("_done", "_in_flight", "_jobs", "_max_workers", "_notify", "_started", "_threads")

    def __init__(self, max_workers: int, notify: Callable[[], None]) -> None:
        self._max_workers = max_workers
        self._notify = notify
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._in_flight = 0  # submitted and not yet drained; touched on the hub thread only
        self._started = 0

    @property
    def in_flight(self) -> int:
        """Jobs submitted whose completion the hub has not drained yet (abandoned ones included)."""
        return self._in_flight

    @property
    def threads_started(self) -> int:
        """How many worker threads this pool has started."""
        return self._started

    def submit(self, job: Job) -> None:
        """Queue ``job``; start another worker if every started one is busy and the bound allows."""
        if self._in_flight >= len(self._threads) and len(self._threads) < self._max_workers:
            name = f"mayfly-offload-{self._started + 1}"
            thread = threading.Thread(target=self._work, name=name, daemon=True)
            thread.start()  # may raise; then nothing was counted or queued
            self._started += 1
            self._threads.append(thread)
        self._in_flight += 1
        self._jobs.put(job)

    def drain(self) -> list[Job]:
        """Take every completed job off the completion queue (hub thread only)."""
        done: list[Job] = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._in_flight -= len(done)
        return done

    def shutdown(self, timeout: float) -> list[str]:
        """Stop every worker, waiting ``timeout`` seconds at most in all; return those still alive.

        A worker still inside a blocking call cannot be stopped: it is a daemon
        thread, it exits as soon as its call returns, and its result is dropped.
        """
        for _ in self._threads:
            self._jobs.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        self._threads = []
        return alive

    def _work(self) -> None:
        jobs, done, notify = self._jobs, self._done, self._notify
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            fn, job.fn = job.fn, None
            args, job.args = job.args, ()
            if not job.abandoned and fn is not None:
                job.ran = True
                try:
                    job.result = fn(*args)
                except BaseException as exc:  # every outcome goes back to the caller's task
                    job.error = exc
            del fn, args
            done.put(job)
            notify()
