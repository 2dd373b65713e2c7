"""One worker driving many runs at once, against the serial chain on the same journal, in one run.

Prints, for the journal URL given (default: a fresh ``file://`` store in fsync mode):

1. the serial chain: one run of ``--chain`` cooperative no-op nodes driven by
   ``WorkflowRuntime.execute`` (nodes/s);
2. the worker: ``--runs`` runs of ``--nodes`` no-op nodes submitted with
   ``WorkflowRuntime.start``, then one ``mayfly.Worker`` with concurrency
   ``--runs`` drives them all (nodes/s, and the ratio to the serial chain;
   issue 16's target is >= 3x);
3. the store's raw floor measured in the same run (:func:`store_floor`):
   one durable commit at a time (commits/s), so a figure can be read against
   the disk and server it ran on;
4. parking: ``--parked`` runs (default 10,000) that each park on a signal under
   the worker; the submit and the claim-drive-park time per run, and the
   resident memory the worker process still holds per parked run;
5. wake-up latency: an idle ``mayfly worker`` process (poll interval one
   minute) and the time from ``start()`` returning to the run's first handler
   starting, over ``--latency`` submissions (median and worst).

Timings are printed, never asserted. Run:
``python packages/mayfly/benchmarks/bench_worker.py [--journal URL] [--runs 100] [--nodes 10]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.runtime import WaitForSignal, WorkflowRuntime, new_signal_token
from mayfly.worker import Worker


def registry() -> HandlerRegistry:
    reg = HandlerRegistry()
    reg.register("noop", 1, lambda req: Succeeded(), cooperative=True)

    def park(req: Any) -> Any:
        if req.signal is None:
            return WaitForSignal("go", new_signal_token(), timeout_ms=86_400_000)
        return Succeeded()

    reg.register("park", 1, park, cooperative=True)
    return reg


def chain(name: str, length: int, handler: str = "noop@1") -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=handler, depends_on=(f"n{i - 1}",) if i else ()) for i in range(length)
    )
    return WorkflowSpec(workflow_id=f"bench.{name}", version=1, nodes=nodes)


def resident_kb() -> int:
    """This process's resident set size now (KB), not its peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def raw_floor(directory: Path, count: int = 300) -> float:
    path = directory / "raw-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, b"x" * 300)
            os.fdatasync(fd)
        return count / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()


def store_floor(url: str, scratch: Path, count: int = 300) -> tuple[str, float]:
    """The store's raw one-commit rate, measured now beside the figures: what one durable commit costs.

    ``file://`` and ``lmdb://``: ``write`` + ``fdatasync`` of one small record in
    the store's directory. ``postgresql://``: one-row ``INSERT`` commits into a
    scratch table on the same server. ``redis://``: ``SET`` round trips to the
    same server (durable when it runs ``appendfsync always``).
    """
    scheme = url.split(":", 1)[0]
    if scheme in ("file", "lmdb"):
        directory = Path(url.split("://", 1)[1].split("?", 1)[0])
        directory = directory if directory.is_dir() else directory.parent
        return "write + fdatasync, serial", raw_floor(directory if directory.is_dir() else scratch, count)
    if scheme.startswith("postgres"):
        import psycopg  # noqa: PLC0415 - only when benchmarking PostgreSQL

        conninfo = url.split("?", 1)[0]
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # A logged table (a temporary one writes no WAL, so its commits would wait for nothing).
            conn.execute("CREATE TABLE IF NOT EXISTS mayfly_bench_floor (n int)")
            try:
                started = time.perf_counter()
                for n in range(count):
                    conn.execute("INSERT INTO mayfly_bench_floor VALUES (%s)", (n,))
                rate = count / (time.perf_counter() - started)
            finally:
                conn.execute("DROP TABLE mayfly_bench_floor")
            return "one-row INSERT commits, serial", rate
    if scheme.startswith("redis"):
        import redis  # noqa: PLC0415 - only when benchmarking Redis

        client = redis.Redis.from_url(url.split("?", 1)[0])
        started = time.perf_counter()
        for n in range(count):
            client.set("mayfly-bench-floor", n)
        client.delete("mayfly-bench-floor")
        return "SET round trips, serial", count / (time.perf_counter() - started)
    return "unknown store", float("nan")


def drive_all(url: str, runs: int, *, until: str = "ended", log: list[dict[str, Any]] | None = None) -> float:
    """Run a worker until every submitted run ended (or parked); return the seconds it took."""
    seen = {"ended": 0, "parked": 0}

    def record(event: dict[str, Any]) -> None:
        if event["event"] in seen:
            seen[event["event"]] += 1
        if log is not None:
            log.append(event)

    worker = Worker(url, registry(), concurrency=max(1, min(runs, 1000)), poll_interval_ms=50, log=record)
    started = time.perf_counter()
    worker.run(until=lambda: seen[until] >= runs)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--journal", help="journal URL (default: a temporary file:// store, fsync)")
    parser.add_argument("--chain", type=int, default=300)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--latency", type=int, default=20)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mayfly-bench-worker-", dir=os.environ.get("MAYFLY_BENCH_DIR")))
    url = args.journal or f"file://{scratch}/store"

    runtime = WorkflowRuntime(url, registry())
    started = time.perf_counter()
    runtime.execute(chain("chain", args.chain))
    serial = args.chain / (time.perf_counter() - started)

    spec = chain("fan", args.nodes)
    for _ in range(args.runs):
        runtime.start(spec)
    seconds = drive_all(url, args.runs)
    concurrent = args.runs * args.nodes / seconds

    print(f"journal: {url}")
    print(f"serial chain of {args.chain} nodes:          {serial:10,.0f} nodes/s")
    print(
        f"worker, {args.runs} runs x {args.nodes} nodes at once: {concurrent:10,.0f} nodes/s  "
        f"ratio {concurrent / serial:.2f}x the serial chain (target >= 3x)"
    )
    how, floor = store_floor(url, scratch)
    print(f"raw floor ({how}): {floor:10,.0f} commits/s")

    if args.parked:
        parked_url = f"{url}-parked" if url.startswith("file://") else url
        parked_runtime = WorkflowRuntime(parked_url, registry())
        spec = chain("park", 1, "park@1")
        started = time.perf_counter()
        for _ in range(args.parked):
            parked_runtime.start(spec)
        submitted = time.perf_counter() - started
        gc.collect()
        before = resident_kb()
        seconds = drive_all(parked_url, args.parked, until="parked")
        gc.collect()
        held = (resident_kb() - before) / args.parked
        print(
            f"{args.parked} runs parked on a signal: submit {submitted / args.parked * 1000:.2f} ms/run, "
            f"claim-drive-park {seconds / args.parked * 1000:.2f} ms/run (both with their commits), "
            f"resident memory held {held * 1024:,.0f} B/run after parking them all (target <= 8 KB)"
        )

    if args.latency:
        latencies = sorted(wake_latency(url, scratch, args.latency))
        print(
            f"submit -> first handler with an idle worker (poll interval 60 s), {len(latencies)} runs: "
            f"median {latencies[len(latencies) // 2] * 1000:.1f} ms, worst {latencies[-1] * 1000:.1f} ms "
            "(target: within 50 ms)"
        )


LATENCY_HANDLERS = """
import time
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()


@registry.handler("stamp", version=1)
def stamp(req):
    with open(req.run_input["file"], "w") as f:
        f.write(repr(time.time()))
    return Succeeded()
"""


def wake_latency(url: str, scratch: Path, count: int) -> list[float]:
    """Seconds from start() returning to the run's first handler starting, with an idle worker process."""
    handlers = scratch / "latency_handlers.py"
    handlers.write_text(LATENCY_HANDLERS)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mayfly",
            "--journal",
            url,
            "worker",
            "--json",
            "--handlers",
            str(handlers),
            "--poll-interval",
            "60000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        worker.stderr.readline()  # started
        runtime = WorkflowRuntime(url)
        spec = WorkflowSpec(workflow_id="bench.latency", version=1, nodes=(Node("s", handler="stamp@1"),))
        latencies = []
        for i in range(count):
            time.sleep(0.2)  # idle again
            stamp = scratch / f"stamp-{i}"
            runtime.start(spec, {"file": str(stamp)})
            returned = time.time()
            deadline = time.monotonic() + 70
            while not stamp.exists() or not stamp.read_text():
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker never started the run")
                time.sleep(0.001)
            latencies.append(float(stamp.read_text()) - returned)
        return latencies
    finally:
        worker.terminate()
        worker.wait(timeout=60)


if __name__ == "__main__":
    main()
