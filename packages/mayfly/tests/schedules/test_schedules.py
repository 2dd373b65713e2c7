"""Durable schedules: when they fire (cron and intervals), what a worker starts, exactly one run per tick."""

from __future__ import annotations

import calendar
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mayfly import Node, WorkflowSpec
from mayfly.errors import InvalidRecord
from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import Cron, Schedule, tick_run_id

SPEC = WorkflowSpec(workflow_id="sched.tick", version=1, nodes=(Node("n", handler="tick@1"),))


def utc(text: str) -> int:
    """Unix ms of a UTC time written ``YYYY-MM-DD HH:MM``."""
    return calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M")) * 1000


def show(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M %a", time.gmtime(ms // 1000))


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("*/15 * * * *", "2026-12-01 10:07", "2026-12-01 10:15 Tue"),
        ("*/15 * * * *", "2026-12-01 10:45", "2026-12-01 11:00 Tue"),
        ("0 9 * * 1-5", "2026-12-04 09:00", "2026-12-07 09:00 Mon"),  # Friday 09:00 -> Monday
        ("30 2 1 * *", "2026-12-15 00:00", "2027-01-01 02:30 Fri"),
        ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00 Tue"),  # the next leap day
        ("0 12 13 * 5", "2026-12-01 00:00", "2026-12-04 12:00 Fri"),  # both day fields: either matches
        ("0 0 * * 7", "2026-12-01 00:00", "2026-12-06 00:00 Sun"),  # 7 is Sunday too
        ("5,10 1-2 * * *", "2026-12-01 01:07", "2026-12-01 01:10 Tue"),
        ("0 9 * * MON-FRI", "2026-12-04 09:00", "2026-12-07 09:00 Mon"),  # names
        ("0 0 L * *", "2026-02-01 00:00", "2026-02-28 00:00 Sat"),  # the last day of the month
        ("0 12 * JAN 5#2", "2026-12-01 00:00", "2027-01-08 12:00 Fri"),  # the second Friday of January
    ],
)
def test_cron_next_tick(expression: str, after: str, expected: str) -> None:
    assert show(Cron(expression).next_after(utc(after))) == expected


def test_cron_latest_tick_at_or_before() -> None:
    cron = Cron("0 9 * * 1-5")
    assert show(cron.latest_at(utc("2026-12-06 12:00")) or 0) == "2026-12-04 09:00 Fri"
    assert show(cron.latest_at(utc("2026-12-07 09:00")) or 0) == "2026-12-07 09:00 Mon"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "expected five fields"),
        ("* * * * * *", "expected five fields"),  # cronsim's seconds field is not taken
        ("60 * * * *", "bad minute"),
        ("*/0 * * * *", "bad minute"),
        ("a * * * *", "bad minute"),
        ("0 24 * * *", "bad hour"),
        ("0 0 * * 8", "bad day-of-week"),
        ("0 0 31 2 *", "bad day-of-month"),  # 31 February never comes
    ],
)
def test_bad_cron_expressions_are_refused(expression: str, message: str) -> None:
    with pytest.raises(InvalidRecord, match=message):
        Schedule(name="bad", spec=SPEC, cron=expression).next_after(0)


def test_interval_ticks_and_what_a_worker_starts() -> None:
    every = Schedule(name="every-10s", spec=SPEC, every_ms=10_000, offset_ms=3_000)
    assert every.next_after(0) == 3_000 and every.next_after(3_000) == 13_000
    assert every.latest_at(12_999) == 3_000
    # A first look starts only the latest due tick; later looks every tick since the last one.
    assert every.due(None, 35_000) == [33_000]
    assert every.due(33_000, 64_000) == [43_000, 53_000, 63_000]
    catching_up = Schedule(name="c", spec=SPEC, every_ms=10_000, catchup_ms=25_000)
    assert catching_up.due(None, 40_000) == [20_000, 30_000, 40_000]
    assert every.run_input(3_000) == {"scheduled_at_ms": 3_000, "input": None}


def test_schedules_are_checked_when_made() -> None:
    with pytest.raises(InvalidRecord, match="exactly one of every_ms and cron"):
        Schedule(name="x", spec=SPEC)
    with pytest.raises(InvalidRecord, match="every_ms must be in"):
        Schedule(name="x", spec=SPEC, every_ms=10)
    with pytest.raises(InvalidRecord, match="schedule name"):
        Schedule(name="Bad Name", spec=SPEC, every_ms=1_000)


def test_a_tick_has_one_run_id_everywhere() -> None:
    first = tick_run_id("nightly", 1_796_000_000_000)
    assert first == tick_run_id("nightly", 1_796_000_000_000)
    assert uuid.UUID(first).version == 5
    assert first != tick_run_id("nightly", 1_796_000_060_000) != tick_run_id("hourly", 1_796_000_000_000)


HANDLERS = """
import os
from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.schedules import Schedule

registry = HandlerRegistry()

@registry.handler("tick", version=1)
def tick(req):
    # One file per invocation: a tick run twice would leave two.
    path = os.path.join(os.environ["TEST_CALLS"], f"{req.run_input['scheduled_at_ms']}-{os.getpid()}-{req.attempt_id}")
    open(path, "w").close()
    return Succeeded()

SPEC = WorkflowSpec(workflow_id="sched.tick", version=1, nodes=(Node("n", handler="tick@1"),))
schedules = [Schedule(name="every-second", spec=SPEC, every_ms=1000)]
"""


@pytest.mark.slow
def test_three_workers_start_exactly_one_run_per_tick(tmp_path: Path) -> None:
    """Three `mayfly worker` processes serve one schedule for a few seconds: every tick runs once."""
    url = f"file://{tmp_path}/store"
    (tmp_path / "calls").mkdir()
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    env = {**os.environ, "TEST_CALLS": str(tmp_path / "calls")}
    command = [
        sys.executable,
        "-m",
        "mayfly",
        "--journal",
        url,
        "worker",
        "--json",
        "--handlers",
        str(handlers),
    ]
    workers = [
        subprocess.Popen([*command, "--poll-interval", "200"], stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    try:
        for worker in workers:
            assert worker.stderr is not None
            assert json.loads(worker.stderr.readline())["event"] == "started"
        started = time.time()
        time.sleep(4.5)
        stopped = time.time()
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(timeout=30) for worker in workers]
    assert codes == [0, 0, 0]
    ticks = sorted({int(name.split("-")[0]) for name in os.listdir(tmp_path / "calls")})
    calls = os.listdir(tmp_path / "calls")
    assert len(ticks) >= 3
    assert len(calls) == len(ticks)  # no tick's handler ran twice
    inside = [t for t in range(int(started * 1000) // 1000 * 1000 + 1000, int(stopped * 1000) - 500, 1000)]
    assert set(inside) <= set(ticks), f"ticks without a run: {sorted(set(inside) - set(ticks))}"
    runtime = WorkflowRuntime(url)
    for tick in ticks:
        run_id = tick_run_id("every-second", tick)
        assert runtime.summary(run_id).status.value == "succeeded"
        assert runtime.inspect(run_id).state.input == {"scheduled_at_ms": tick, "input": None}
