"""Benchmark of the greenlet hub (mayfly.substrate): prints a small report, asserts nothing.

Run: ``python bench_substrate.py [--tasks 10000] [--rounds 20000]``.

Measured in one process, one run:

* spawn+run+finish of a trivial task, a park/wake through a Channel, a checkpoint;
* an ``offload`` round trip next to a bare ``queue.SimpleQueue`` round trip to a
  thread (the ratio is what the hub's bookkeeping and selector wake-up cost);
* N concurrently parked tasks, each with its own timer, on a VirtualClock:
  wall time and peak RSS before and after.

The bare-queue baseline's echo thread is itself started through ``offload``, so
even the benchmark creates no thread outside the substrate's pool.
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from mayfly.substrate import Channel, Hub, VirtualClock, checkpoint, offload, sleep, spawn


def _rss_kib() -> int | None:
    """Current resident set size in KiB (Linux /proc), or None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_rss_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS reports bytes


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - started)


def bench_spawn(n: int) -> float:
    """Nanoseconds per spawn + first switch + finish of a no-op task."""

    def main() -> None:
        for _ in range(n):
            spawn(_noop)
        checkpoint()  # every spawned task runs to completion before main resumes

    return _timed(lambda: Hub().run(main)) / n


def bench_park_wake(n: int) -> float:
    """Nanoseconds per park/wake: two tasks ping-pong over two channels (two per round trip)."""

    def main() -> None:
        ping: Channel[int] = Channel()
        pong: Channel[int] = Channel()

        def echo() -> None:
            for _ in range(n):
                pong.send(ping.receive())

        task = spawn(echo)
        for i in range(n):
            ping.send(i)
            pong.receive()
        task.join()

    return _timed(lambda: Hub().run(main)) / (2 * n)


def bench_checkpoint(n: int) -> float:
    """Nanoseconds per checkpoint (yield to the back of the ready queue) with two tasks."""

    def spin() -> None:
        for _ in range(n):
            checkpoint()

    def main() -> None:
        other = spawn(spin)
        spin()
        other.join()

    return _timed(lambda: Hub().run(main)) / (2 * n)


def bench_offload(n: int) -> tuple[float, float]:
    """Nanoseconds per offload round trip, and per bare SimpleQueue round trip to a thread."""
    results: dict[str, float] = {}

    def main() -> None:
        for _ in range(min(n, 1000)):  # warm the worker
            offload(_noop)
        started = time.perf_counter_ns()
        for _ in range(n):
            offload(_noop)
        results["offload"] = (time.perf_counter_ns() - started) / n

        requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        replies: queue.SimpleQueue[int] = queue.SimpleQueue()
        echo = spawn(offload, _echo, requests, replies)
        checkpoint()  # let the echo task submit its call
        for i in range(min(n, 1000)):
            requests.put(i)
            replies.get()
        started = time.perf_counter_ns()
        for i in range(n):
            requests.put(i)  # the hub thread blocks here on purpose: it is the baseline
            replies.get()
        results["bare"] = (time.perf_counter_ns() - started) / n
        requests.put(None)
        echo.join()

    Hub(offload_workers=2).run(main)
    return results["offload"], results["bare"]


def _echo(requests: queue.SimpleQueue[int | None], replies: queue.SimpleQueue[int]) -> None:
    while (item := requests.get()) is not None:
        replies.put(item)


def _noop() -> None:
    return None


def bench_parked(n: int) -> dict[str, float]:
    """N tasks parked at once, each on its own timer, on a VirtualClock."""
    report: dict[str, float] = {}
    hub = Hub(VirtualClock())

    def sleeper(i: int) -> None:
        sleep(1 + (i * 7919) % 3600)  # deadlines spread over an hour, many shared
        sleep(0.5)

    def main() -> None:
        tasks = [spawn(sleeper, i) for i in range(n)]
        checkpoint()  # now every sleeper is parked on its first timer
        rss = _rss_kib()
        report["rss_parked_kib"] = float(rss) if rss is not None else float("nan")
        for task in tasks:
            task.join()
        report["virtual_ms"] = float(hub.now_ms())

    gc.collect()
    report["rss_before_kib"] = float(_rss_kib() or 0)
    report["peak_before_kib"] = float(_peak_rss_kib())
    report["wall_s"] = _timed(lambda: hub.run(main)) / 1e9
    gc.collect()
    report["peak_after_kib"] = float(_peak_rss_kib())
    report["rss_after_kib"] = float(_rss_kib() or 0)
    report["timers_fired"] = float(hub.stats().timers_fired)
    return report


def main() -> None:
    """Run every measurement and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="concurrently parked tasks")
    parser.add_argument("--rounds", type=int, default=20_000, help="iterations per micro-benchmark")
    args = parser.parse_args()
    rounds: int = args.rounds

    print(f"mayfly.substrate benchmark (python {sys.version.split()[0]}, {sys.platform})")
    print(f"{'measurement':<46}{'value':>16}")
    print("-" * 62)
    spawn_ns = bench_spawn(rounds)
    print(f"{'spawn + run + finish, per task':<46}{spawn_ns:>13.0f} ns")
    park_ns = bench_park_wake(rounds)
    print(f"{'park/wake via Channel, per switch':<46}{park_ns:>13.0f} ns")
    cp_ns = bench_checkpoint(rounds)
    print(f"{'checkpoint (yield), per switch':<46}{cp_ns:>13.0f} ns")
    offload_ns, bare_ns = bench_offload(rounds)
    print(f"{'offload round trip':<46}{offload_ns:>13.0f} ns")
    print(f"{'bare SimpleQueue round trip to a thread':<46}{bare_ns:>13.0f} ns")
    print(f"{'ratio offload / bare':<46}{offload_ns / bare_ns:>15.2f}x")
    parked = bench_parked(args.tasks)
    label = f"{args.tasks} parked tasks with timers (VirtualClock)"
    print(f"{label:<46}{parked['wall_s']:>14.3f} s")
    print(f"{'  virtual time covered':<46}{parked['virtual_ms'] / 1000:>14.1f} s")
    print(f"{'  timers fired':<46}{parked['timers_fired']:>16.0f}")
    print(f"{'  RSS before':<46}{parked['rss_before_kib'] / 1024:>13.1f} MiB")
    print(f"{'  RSS with all tasks parked':<46}{parked['rss_parked_kib'] / 1024:>13.1f} MiB")
    per_task = (parked["rss_parked_kib"] - parked["rss_before_kib"]) * 1024 / args.tasks
    print(f"{'  RSS growth per parked task':<46}{per_task:>14.0f} B")
    print(f"{'  RSS after the run':<46}{parked['rss_after_kib'] / 1024:>13.1f} MiB")
    print(f"{'  peak RSS before (getrusage)':<46}{parked['peak_before_kib'] / 1024:>13.1f} MiB")
    print(f"{'  peak RSS after (getrusage)':<46}{parked['peak_after_kib'] / 1024:>13.1f} MiB")


if __name__ == "__main__":
    main()
