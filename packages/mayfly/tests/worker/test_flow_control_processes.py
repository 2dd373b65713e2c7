"""Queue flow control under three `mayfly worker` processes on one store, checked from the journal.

The limits are set with `mayfly queue set` and the runs submitted as users do;
what the test checks is what the journal and the run index recorded: handler
outputs carry the wall times each attempt ran (a run's handlers run only under
its lease), and the index records each run's first claim.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_worker_processes import Env, history

from mayfly.runindex import RUN_INDEX
from mayfly.runtime import WorkflowRuntime

pytestmark = pytest.mark.slow

HANDLERS = """
import time
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()

@registry.handler("nap", version=1)
def nap(req):
    started = time.time_ns() // 1_000_000
    time.sleep(0.05)
    return Succeeded(output={"from": started, "to": time.time_ns() // 1_000_000})
"""

NAP = {
    "workflow_id": "flow.nap",
    "version": 1,
    "nodes": [{"id": "a", "handler": "nap@1"}, {"id": "b", "handler": "nap@1", "depends_on": ["a"]}],
}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    environment = Env(tmp_path)
    environment.handlers.write_text(HANDLERS)
    (tmp_path / "nap.json").write_text(json.dumps(NAP))
    yield environment
    environment.stop()


def submit(env: Env, count: int, *flags: str) -> list[str]:
    return [
        json.loads(env.cli("submit", str(env.root / "nap.json"), "--json", *flags).stdout)["run_id"]
        for _ in range(count)
    ]


def serve(env: Env, runs: list[str], workers: int = 3, timeout: float = 90) -> None:
    for _ in range(workers):
        env.worker("--concurrency", "4")
    env.wait_all(runs, timeout)
    assert all(env.status(run)["status"] == "succeeded" for run in runs)


def spans(env: Env, runs: list[str]) -> dict[str, tuple[int, int]]:
    """Each run's wall time in its handlers, from the outputs its journal committed (one per node)."""
    result = {}
    for run in runs:
        outputs = [e.outcome.output for e in history(env, run) if type(e).__name__ == "NodeOutcomeCommitted"]
        assert len(outputs) == 2, f"run {run}: {outputs}"
        result[run] = (min(o["from"] for o in outputs), max(o["to"] for o in outputs))
    return result


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    points = sorted(itertools.chain(((s, 1) for s, _ in intervals), ((e, -1) for _, e in intervals)))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def test_concurrency_two_is_never_exceeded_by_three_workers(env: Env) -> None:
    """Twelve runs, three workers with room for four each: never three runs in progress at once."""
    env.cli("queue", "set", "narrow", "--concurrency", "2")
    runs = submit(env, 12, "--queue", "narrow")
    serve(env, runs)
    intervals = list(spans(env, runs).values())
    assert most_at_once(intervals) == 2, sorted(intervals)


def test_the_rate_limit_holds_across_three_workers(env: Env) -> None:
    """Rate 3 per second over nine runs: the recorded first claims never put four in one second."""
    env.cli("queue", "set", "paced", "--rate", "3/1s")
    runs = submit(env, 9, "--queue", "paced")
    serve(env, runs)
    index = RUN_INDEX.of(WorkflowRuntime(env.url).journal)
    assert index is not None
    starts = {run: index.index_get(run).started_ms for run in runs}  # type: ignore[union-attr]
    ordered = sorted(s for s in starts.values() if s is not None)
    assert len(ordered) == 9, starts
    assert all(b - a >= 1000 for a, b in zip(ordered, ordered[3:], strict=False)), ordered
    for run, (first, _) in spans(env, runs).items():
        assert starts[run] is not None and starts[run] <= first + 1, "a run's handlers ran after its start"


def test_higher_priorities_run_first_under_three_workers(env: Env) -> None:
    """Three low-priority runs submitted before three high ones: with one slot, every high one runs first."""
    env.cli("queue", "set", "ranked", "--priority", "--concurrency", "1")
    low = submit(env, 3, "--queue", "ranked", "--priority", "1")
    high = submit(env, 3, "--queue", "ranked", "--priority", "9")
    serve(env, low + high)
    times = spans(env, low + high)
    assert max(times[run][1] for run in high) <= min(times[run][0] for run in low), times


def test_three_racing_submitters_of_one_dedup_id_create_one_run(env: Env) -> None:
    """Three `mayfly submit --dedup-id` at once: one run is created, the others exit 7 naming it."""
    command = [
        sys.executable,
        "-m",
        "mayfly",
        "--journal",
        env.url,
        "submit",
        str(env.root / "nap.json"),
        "--queue",
        "orders",
        "--dedup-id",
        "order-7",
        "--json",
    ]
    racers = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env.env)
        for _ in range(3)
    ]
    results = [(racer.wait(timeout=60), *racer.communicate()) for racer in racers]
    created = [json.loads(out)["run_id"] for code, out, _ in results if code == 0]
    assert len(created) == 1, results
    refused = [err for code, _, err in results if code != 0]
    assert all(code in (0, 7) for code, _, _ in results), results
    assert all(created[0] in err for err in refused), refused
    serve(env, created, workers=3)
    again = submit(env, 1, "--queue", "orders", "--dedup-id", "order-7")  # the first ended: allowed
    assert again != created
    deadline = time.monotonic() + 30
    while env.status(again[0])["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert env.status(again[0])["status"] == "succeeded"
