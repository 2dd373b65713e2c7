"""Stored schedules on PostgreSQL: two `mayfly worker` processes, one run per tick; damage fails closed.

The process test is the core's (packages/mayfly/tests/schedules/test_stored_schedules.py) on
PostgreSQL: the schedule is added with `mayfly schedule add`, the workers learn it from the
journal alone, and the runs are checked from the journal.
"""

from __future__ import annotations

import itertools
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgserver import drop_schema, with_options

# The two-worker schedule harness is the core's (packages/mayfly/tests/schedules/schedule_workers.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "mayfly" / "tests" / "schedules"))

from schedule_workers import POLL_MS, Site  # after the path above

from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.schedules import Schedule, encode_schedule
from mayfly_postgres import PostgresJournal


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
