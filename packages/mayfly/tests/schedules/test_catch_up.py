"""Catch-up policies on a virtual clock: which missed ticks a worker's first look starts, and the cap."""

from __future__ import annotations

import calendar
import time

import pytest

from mayfly import Node, WorkflowSpec
from mayfly.errors import InvalidRecord
from mayfly.schedules import MAX_CATCH_UP, Schedule, TickPlan, check_schedules

SPEC = WorkflowSpec(workflow_id="sched.catch", version=1, nodes=(Node("n", handler="n@1"),))
S = 1_000


def every_10s(catch_up: str | None = None, catchup_ms: int | None = None) -> Schedule:
    return Schedule(name="c", spec=SPEC, every_ms=10 * S, catch_up=catch_up, catchup_ms=catchup_ms)  # type: ignore[arg-type]


# Ticks every 10 s. The worker looks first at `now`; the store says the schedule was stored at `stored`
# and its last started tick is `last`. Missed ticks: after `last`, at or after `stored`, within the window.
@pytest.mark.parametrize(
    ("catch_up", "catchup_ms", "last", "stored", "now", "expected"),
    [
        # skip: nothing missed starts; only a tick exactly at now.
        ("skip", None, 10 * S, 0, 65 * S, []),
        ("skip", None, 10 * S, 0, 60 * S, [60 * S]),
        ("skip", None, 60 * S, 0, 60 * S, []),  # that tick is already started
        # one: the latest missed tick, once.
        ("one", None, 10 * S, 0, 65 * S, [60 * S]),
        ("one", None, 60 * S, 0, 65 * S, []),  # nothing missed since the last tick
        ("one", None, None, 62 * S, 65 * S, []),  # stored after the latest tick: nothing missed
        ("one", None, None, None, 65 * S, [60 * S]),  # a code schedule: the latest tick
        ("one", 3 * S, None, None, 65 * S, []),  # the latest tick is older than the window
        # all: every missed tick, oldest first.
        ("all", None, 10 * S, 0, 65 * S, [20 * S, 30 * S, 40 * S, 50 * S, 60 * S]),
        ("all", None, None, 35 * S, 65 * S, [40 * S, 50 * S, 60 * S]),  # from when it was stored
        ("all", None, None, 40 * S, 65 * S, [40 * S, 50 * S, 60 * S]),  # a tick at the store time counts
        ("all", 25 * S, 10 * S, 0, 65 * S, [40 * S, 50 * S, 60 * S]),  # bounded by the window
        ("all", None, 60 * S, 0, 65 * S, []),
        # no catch_up but a window: every tick in the window (what catchup_ms meant before policies).
        (None, 25 * S, None, None, 40 * S, [20 * S, 30 * S, 40 * S]),
        (None, None, 10 * S, 0, 65 * S, [60 * S]),  # neither: one
    ],
)
def test_first_look_starts_what_the_policy_says(
    catch_up: str | None,
    catchup_ms: int | None,
    last: int | None,
    stored: int | None,
    now: int,
    expected: list[int],
) -> None:
    plan = every_10s(catch_up, catchup_ms).plan(None, now, last_tick_ms=last, stored_ms=stored)
    assert plan == TickPlan(expected)


@pytest.mark.parametrize("catch_up", ["skip", "one", "all"])
def test_a_serving_worker_starts_every_tick_whatever_the_policy(catch_up: str) -> None:
    """After the first look, every tick since the last look starts (the policy is only for downtime)."""
    plan = every_10s(catch_up).plan(30 * S, 61 * S, last_tick_ms=0, stored_ms=0)
    assert plan.ticks == [40 * S, 50 * S, 60 * S]


def test_all_starts_at_most_the_latest_thousand_and_says_it_left_some_out() -> None:
    day = 86_400 * S
    plan = every_10s("all").plan(None, day, last_tick_ms=0, stored_ms=0)
    assert len(plan.ticks) == MAX_CATCH_UP and plan.left_out
    assert plan.ticks[-1] == day and plan.ticks[0] == day - (MAX_CATCH_UP - 1) * 10 * S
    exact = every_10s("all").plan(None, MAX_CATCH_UP * 10 * S, last_tick_ms=0, stored_ms=0)
    assert len(exact.ticks) == MAX_CATCH_UP and not exact.left_out


def at(text: str) -> int:
    """Unix ms of a UTC time written ``YYYY-MM-DD HH:MM``."""
    return calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M")) * 1000


def test_cron_catch_up_walks_back_over_days() -> None:
    """A weekday 09:00 schedule stored on Friday 08:00, first looked at on Tuesday 10:00."""
    weekdays = Schedule(name="w", spec=SPEC, cron="0 9 * * 1-5", catch_up="all")
    plan = weekdays.plan(None, at("2026-12-08 10:00"), stored_ms=at("2026-12-04 08:00"))
    shown = [time.strftime("%a %d %H:%M", time.gmtime(t // 1000)) for t in plan.ticks]
    assert shown == ["Fri 04 09:00", "Mon 07 09:00", "Tue 08 09:00"]
    one = Schedule(name="w", spec=SPEC, cron="0 9 * * 1-5").plan(
        None, at("2026-12-08 10:00"), stored_ms=at("2026-12-04 08:00")
    )
    assert [time.strftime("%a %d", time.gmtime(t // 1000)) for t in one.ticks] == ["Tue 08"]


def test_all_without_a_record_of_the_last_tick_needs_a_window() -> None:
    """A code schedule keeps no last tick: 'all' without catchup_ms is refused when a worker gets it."""
    with pytest.raises(InvalidRecord, match="needs catchup_ms"):
        check_schedules([every_10s("all")])
    assert check_schedules([every_10s("all", 60 * S)])[0].policy == "all"
    with pytest.raises(InvalidRecord, match="needs catchup_ms"):
        every_10s("all").plan(None, 65 * S)
    with pytest.raises(InvalidRecord, match="catch_up must be one of"):
        every_10s("sometimes")
