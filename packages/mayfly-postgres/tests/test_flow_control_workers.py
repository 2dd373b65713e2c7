"""Queue flow control on PostgreSQL under three `mayfly worker` processes, checked from the journal.

Limits are set with `mayfly queue set` and runs submitted with `mayfly submit`,
as an operator would. The checks read facts only: each handler's output records
the wall times it ran (a run's handlers run only under its lease, so runs whose
handler times overlap were in progress together), and the run index records
each run's first claim (its start).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pgserver import drop_schema, with_options

from mayfly.reducer import decode_event
from mayfly_postgres import PostgresJournal

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
    "workflow_id": "pgflow.nap",
    "version": 1,
    "nodes": [{"id": "a", "handler": "nap@1"}, {"id": "b", "handler": "nap@1", "depends_on": ["a"]}],
}


class Cluster:
    """A schema of the test's own, a handlers file, and the `mayfly` processes run against them."""

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root
        self.handlers = root / "handlers.py"
        self.handlers.write_text(HANDLERS)
        self.spec = root / "nap.json"
        self.spec.write_text(json.dumps(NAP))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.workers: list[subprocess.Popen[str]] = []

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mayfly", "--journal", self.url, *args]

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            self.command(*args), capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def submit(self, count: int, *flags: str) -> list[str]:
        return [
            json.loads(self.cli("submit", str(self.spec), "--json", *flags))["run_id"] for _ in range(count)
        ]

    def serve(self, runs: list[str], workers: int = 3, timeout: float = 120) -> None:
        for _ in range(workers):
            command = self.command("worker", "--json", "--handlers", str(self.handlers), "--concurrency", "4")
            self.workers.append(
                subprocess.Popen(
                    [*command, "--poll-interval", "200"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=self.env,
                )
            )
        deadline = time.monotonic() + timeout
        with PostgresJournal(self.url) as journal:
            while time.monotonic() < deadline:
                entries = [journal.index_get(run) for run in runs]
                if all(entry is not None and entry.status.value == "terminal" for entry in entries):
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"runs still open after {timeout} s")
            for run in runs:
                assert any(type(e).__name__ == "RunCompleted" for e in self.history(journal, run))

    @staticmethod
    def history(journal: PostgresJournal, run: str) -> list[Any]:
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run)]

    def spans(self, runs: list[str]) -> dict[str, tuple[int, int]]:
        """Each run's wall time in its handlers, from the outputs its journal committed (one per node)."""
        result = {}
        with PostgresJournal(self.url) as journal:
            for run in runs:
                history = self.history(journal, run)
                outputs = [e.outcome.output for e in history if type(e).__name__ == "NodeOutcomeCommitted"]
                assert len(outputs) == 2, f"run {run}: {outputs}"
                result[run] = (min(o["from"] for o in outputs), max(o["to"] for o in outputs))
        return result

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=30)


@pytest.fixture
def cluster(server: str, tmp_path: Path) -> Iterator[Cluster]:
    schema = f"mayfly_pgflow_{uuid.uuid4().hex[:12]}"
    made = Cluster(with_options(server, schema=schema), tmp_path)
    yield made
    made.stop()
    drop_schema(server, schema)


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals open at one instant (an end sorts before a start at the same ms)."""
    points = sorted(itertools.chain(((s, 1) for s, _ in intervals), ((e, -1) for _, e in intervals)))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def test_concurrency_two_holds_across_three_workers(cluster: Cluster) -> None:
    """Twelve runs, three workers with room for four each: never three in progress at once."""
    cluster.cli("queue", "set", "narrow", "--concurrency", "2")
    runs = cluster.submit(12, "--queue", "narrow")
    cluster.serve(runs)
    intervals = list(cluster.spans(runs).values())
    assert most_at_once(intervals) == 2, sorted(intervals)


def test_rate_priority_and_dedup_hold_across_three_workers(cluster: Cluster) -> None:
    """Rate 3/s spaces starts; with one slot every high priority runs before every low; a dedup id is refused."""
    cluster.cli("queue", "set", "paced", "--rate", "3/1s")
    paced = cluster.submit(9, "--queue", "paced")
    cluster.cli("queue", "set", "ranked", "--priority", "--concurrency", "1")
    low = cluster.submit(3, "--queue", "ranked", "--priority", "1")
    high = cluster.submit(3, "--queue", "ranked", "--priority", "9")
    first = cluster.submit(1, "--queue", "orders", "--dedup-id", "order-7")
    refused = subprocess.run(
        cluster.command("submit", str(cluster.spec), "--queue", "orders", "--dedup-id", "order-7"),
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 7 and first[0] in refused.stderr, refused.stderr
    cluster.serve(paced + low + high + first)
    with PostgresJournal(cluster.url) as journal:
        starts = sorted(journal.index_get(run).started_ms for run in paced)  # type: ignore[union-attr,type-var]
    assert all(b - a >= 1000 for a, b in zip(starts, starts[3:], strict=False)), starts
    times = cluster.spans(low + high)
    assert max(times[run][1] for run in high) <= min(times[run][0] for run in low), times
    again = cluster.submit(1, "--queue", "orders", "--dedup-id", "order-7")  # the first ended: allowed
    assert again != first
