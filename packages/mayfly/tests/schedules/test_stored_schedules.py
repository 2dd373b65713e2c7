"""Stored schedules served by `mayfly worker` processes: one run per tick, catch-up after downtime, removal.

Schedules are added with `mayfly schedule add` (nothing in the handlers module),
so the workers learn them from the journal alone. Runs are checked from the
journal: every run's id is the tick run id of the tick in its input, each tick
once, none missing while workers ran.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from schedule_workers import POLL_MS, Site

from mayfly.runtime import WorkflowRuntime


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    made = Site(tmp_path, f"file://{tmp_path}/store")
    yield made
    made.close()


def wait_for(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_two_workers_start_one_run_per_tick_of_a_stored_schedule_until_it_is_removed(site: Site) -> None:
    """`schedule add --every 2s`, two workers for ~7 s: each tick one run; after `remove`, no more."""
    site.mayfly("schedule", "add", "tick", str(site.spec), "--every", "2s", "--input", '{"k": 1}')
    began = site.start_workers(2)
    time.sleep(7.0)
    removing = time.time()
    assert "removed" in site.mayfly("schedule", "remove", "tick").stdout
    removed_at = time.time()  # the removal happened between the two (the command takes a while to start)
    time.sleep(2.0 * 2 + POLL_MS / 1000)  # two more ticks would have come
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
    assert len(calls) == len(set(calls)) and set(calls) <= set(ticks), calls  # no tick's handler ran twice
    runtime = WorkflowRuntime(site.url)
    for tick, run_id in started.items():
        assert runtime.inspect(run_id).state.input == {"scheduled_at_ms": tick, "input": {"k": 1}}
    runtime.journal.close()
    # Both workers served it: each logged starting (or finding started) the ticks while it ran.
    for _, log in site.workers:
        assert any(e["event"] == "scheduled" for e in site.events(log)), log.read_text()


@pytest.mark.slow
def test_catch_up_policies_after_downtime(site: Site) -> None:
    """Three every-second schedules (skip, one, all); the worker stops for ~4 s; the next one catches up."""
    for policy in ("skip", "one", "all"):
        site.mayfly("schedule", "add", f"c-{policy}", str(site.spec), "--every", "1s", "--catch-up", policy)
    site.start_workers(1)
    time.sleep(2.5)
    stopped = site.stop_workers()
    time.sleep(4.0)
    restarted = site.start_workers(1)
    time.sleep(2.0)
    site.stop_workers()
    second_log = site.workers[1][1]
    caught = {
        policy: sorted(
            int(str(e["tick_ms"]))
            for e in site.events(second_log)
            if e["event"] == "scheduled"
            and e["schedule"] == f"c-{policy}"
            and int(str(e["tick_ms"])) < (restarted - 0.3) * 1000
        )
        for policy in ("skip", "one", "all")
    }
    # Ticks no worker was running for: after the first stopped (with a margin), before the second started.
    missed = list(
        range(int((stopped + 0.5) * 1000) // 1000 * 1000 + 1000, int((restarted - 0.3) * 1000), 1000)
    )
    assert len(missed) >= 3, (stopped, restarted)
    assert caught["skip"] == [], caught
    assert len(caught["one"]) <= 1 and not set(caught["one"]) & set(missed[:-1]), (caught, missed)
    assert set(missed) <= set(caught["all"]), (caught, missed)
    # Every run is the tick run of one schedule, each tick once.
    started = site.ticks_started("c-skip", "c-one", "c-all")
    # The stored last tick is what the workers recorded: the latest tick started.
    listed = json.loads(site.mayfly("--json", "schedule", "list").stdout)
    last = {row["name"]: row["last_tick_ms"] for row in listed}
    assert last == {name: max(ticks) for name, ticks in started.items()}
