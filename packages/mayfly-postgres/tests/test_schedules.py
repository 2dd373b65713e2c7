"""Stored schedules on PostgreSQL: two `mayfly worker` processes, one run per tick; damage fails closed.

The process test is the core's (packages/mayfly/tests/schedules/test_stored_schedules.py) on
PostgreSQL: the schedule is added with `mayfly schedule add`, the workers learn it from the
journal alone, and the runs are checked from the journal.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgserver import drop_schema, with_options

from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import Schedule, encode_schedule, tick_run_id
from mayfly_postgres import PostgresJournal

HANDLERS = """
import os
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()

@registry.handler("tick", version=1)
def tick(req):
    # One file per invocation: a tick run twice would leave two.
    scheduled = req.run_input["scheduled_at_ms"]
    open(os.path.join(os.environ["TEST_CALLS"], f"{scheduled}-{os.getpid()}-{req.attempt_id}"), "w").close()
    return Succeeded()
"""
SPEC = {"workflow_id": "sched.stored", "version": 1, "nodes": [{"id": "n", "handler": "tick@1"}]}
POLL_MS = 200


class Site:
    """A test's journal, spec and handlers files, and its worker processes."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.calls = root / "calls"
        self.calls.mkdir()
        self.handlers = root / "handlers.py"
        self.handlers.write_text(HANDLERS)
        self.spec = root / "spec.json"
        self.spec.write_text(json.dumps(SPEC))
        self.env = {**os.environ, "TEST_CALLS": str(self.calls)}
        self.workers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def mayfly(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "mayfly", "--journal", self.url, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def start_workers(self, count: int) -> float:
        """Start ``count`` workers; return the time the last one said it started."""
        started = []
        for _ in range(count):
            log = self.root / f"worker-{len(self.workers)}.log"
            with log.open("wb") as stream:
                process = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "mayfly", "--journal", self.url, "worker", "--json"),
                        *("--handlers", str(self.handlers), "--poll-interval", str(POLL_MS)),
                    ],
                    stderr=stream,
                    env=self.env,
                )
            self.workers.append((process, log))
            started.append((process, log))
        for process, log in started:
            deadline = time.monotonic() + 60
            while not any(event["event"] == "started" for event in self.events(log)):
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.02)
        return time.time()

    def stop_workers(self) -> float:
        """SIGTERM every running worker, wait for exit 0; return when the signals were sent."""
        sent = time.time()
        running = [(p, log) for p, log in self.workers if p.poll() is None]
        for process, _ in running:
            process.send_signal(signal.SIGTERM)
        for process, log in running:
            assert process.wait(timeout=60) == 0, log.read_text()
        return sent

    @staticmethod
    def events(log: Path) -> list[dict[str, object]]:
        lines = log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def ticks_started(self, *schedules: str) -> dict[str, dict[int, str]]:
        """Every run in the journal, checked to be a tick run of one of ``schedules``: name -> tick -> run."""
        runtime = WorkflowRuntime(self.url)
        found: dict[str, dict[int, str]] = {name: {} for name in schedules}
        for run_id in runtime.journal.list_runs(limit=10_000):
            state = runtime.inspect(run_id).state
            assert isinstance(state.input, dict), state.input
            tick = state.input["scheduled_at_ms"]
            assert isinstance(tick, int)
            owners = [name for name in schedules if run_id == tick_run_id(name, tick)]
            assert len(owners) == 1, f"run {run_id} is no tick run of {schedules}"
            assert tick not in found[owners[0]]
            found[owners[0]][tick] = run_id
        runtime.journal.close()
        return found

    def handler_calls(self) -> list[int]:
        return sorted(int(name.split("-")[0]) for name in os.listdir(self.calls))

    def close(self) -> None:
        for process, _ in self.workers:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


@pytest.fixture
def pg_url(server: str) -> Iterator[str]:
    """A schema of this test alone (sched_...), dropped afterwards."""
    name = f"sched_{uuid.uuid4().hex[:10]}"
    yield with_options(server, schema=name)
    drop_schema(server, name)


@pytest.fixture
def site(tmp_path: Path, pg_url: str) -> Iterator[Site]:
    made = Site(tmp_path, pg_url)
    yield made
    made.close()


@pytest.mark.slow
def test_two_workers_start_one_run_per_tick_of_a_stored_schedule_until_it_is_removed(site: Site) -> None:
    """`schedule add --every 2s`, two workers for ~7 s: each tick one run; after `remove`, no more."""
    site.mayfly("schedule", "add", "tick", str(site.spec), "--every", "2s", "--input", '{"k": 1}')
    began = site.start_workers(2)
    time.sleep(7.0)
    removing = time.time()
    assert "removed" in site.mayfly("schedule", "remove", "tick").stdout
    removed_at = time.time()
    time.sleep(2.0 * 2 + POLL_MS / 1000)
    site.stop_workers()
    started = site.ticks_started("tick")["tick"]
    ticks = sorted(started)
    assert len(ticks) >= 3, ticks
    assert all(b - a == 2_000 for a, b in itertools.pairwise(ticks)), f"not consecutive: {ticks}"
    first = int(began * 1000) // 2000 * 2000 + 2000
    expected = list(range(first, int(removing * 1000) - 300, 2000))
    assert set(expected) <= set(ticks), f"ticks without a run: {sorted(set(expected) - set(ticks))}"
    late = [t for t in ticks if t > removed_at * 1000 + POLL_MS + 300]
    assert not late, f"ticks started after the schedule was removed: {late}"
    calls = site.handler_calls()
    assert len(calls) == len(set(calls)) and set(calls) <= set(ticks), calls
    for _, log in site.workers:
        assert any(e["event"] == "scheduled" for e in site.events(log)), log.read_text()


def test_damaged_definitions_fail_closed(pg_url: str) -> None:
    """A flipped byte in the stored definition is CorruptionError; an unknown format CompatibilityError."""
    spec = WorkflowSpec(workflow_id="sched.pg", version=1, nodes=(Node("n", handler="n@1"),))
    with PostgresJournal(pg_url) as journal:
        stored = journal.schedule_put(Schedule(name="flip", spec=spec, every_ms=60_000), now_ms=1_000)
        data = bytearray(encode_schedule(stored))
        data[data.index(b"60000")] ^= 0x01  # 60000 -> 70000: valid JSON, wrong checksum
        table = psycopg.sql.Identifier(journal.schema, "schedules")
        with psycopg.connect(pg_url.split("?", maxsplit=1)[0], autocommit=True) as connection:
            update = psycopg.sql.SQL("UPDATE {} SET definition = %s WHERE name = 'flip'").format(table)
            connection.execute(update, (bytes(data),))
            with pytest.raises(CorruptionError, match="fails its checksum"):
                journal.schedule_get("flip")
            with pytest.raises(CorruptionError):
                journal.schedule_list()
            connection.execute(update, (b'{"format":2,"sha256":"00","body":{}}',))
            with pytest.raises(CompatibilityError, match="schedule format 2"):
                journal.schedule_get("flip")
        assert journal.schedule_remove("flip") is True  # a damaged schedule can still be removed
        assert journal.schedule_list() == []
