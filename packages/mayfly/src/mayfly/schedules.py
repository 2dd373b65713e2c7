"""Durable schedules: a workflow started once per tick, however many workers serve the schedule.

A :class:`Schedule` names a specification and when it fires: ``every_ms``
(ticks at whole multiples of the period since the Unix epoch, plus
``offset_ms``) or a five-field ``cron`` expression in UTC. Workers given the
schedule (``Worker(..., schedules=[...])``, or ``schedules`` in the handlers
module of ``mayfly worker``) start its run for each tick that comes while
they serve it.

Exactly one run per tick, with no coordination between workers and no
schedule state to lose: a tick's run id is derived from the schedule's name
and the tick's time (a UUIDv5), and :meth:`~mayfly.runtime.WorkflowRuntime.start`
with a chosen run id creates the run once and returns the existing run to
every later caller. A worker that starts after a tick that no worker saw
starts that tick's run if it is within ``catchup_ms``; by default only the
latest missed tick is started (``catchup_ms=None``), so a schedule that every
worker missed for a day runs once, not 1,440 times.

The run's input is ``{"scheduled_at_ms": TICK, "input": INPUT}``: a handler
reads the tick it runs for from ``request.run_input``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Final, final

import msgspec

from mayfly.model.errors import InvalidRecord
from mayfly.model.ids import QUEUE_NAME
from mayfly.model.json import JsonValue
from mayfly.model.spec import WorkflowSpec

__all__ = ["Cron", "Schedule", "check_schedules", "tick_run_id"]

_NAMESPACE: Final = uuid.UUID("6f1b7a52-0d38-5a0e-9c41-6d61796c7921")
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_.:-]{0,127}")
_MINUTE_MS: Final = 60_000
_DAY_MS: Final = 86_400_000
_FIELDS: Final = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_SEARCH_DAYS: Final = 366 * 8  # a valid expression fires within 8 years (29 February on a Monday: 28 years)


def tick_run_id(schedule: str, tick_ms: int) -> str:
    """The run id of ``schedule``'s run for the tick at ``tick_ms``: the same in every process."""
    return str(uuid.uuid5(_NAMESPACE, f"mayfly-schedule:{schedule}:{tick_ms}"))


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                start, stop = low, high
            elif "-" in body:
                first, _, last = body.partition("-")
                start, stop = int(first), int(last)
            else:
                start = stop = int(body)
                if step_text:
                    stop = high
        except ValueError:
            raise InvalidRecord(f"cron {name} field {text!r}: expected *, N, N-M, lists and /STEP") from None
        if step < 1 or not low <= start <= stop <= high:
            raise InvalidRecord(f"cron {name} field {text!r}: values must lie in {low}..{high}, steps >= 1")
        values.update(range(start, stop + 1, step))
    return frozenset(values)


@final
class Cron:
    """A five-field cron expression (minute hour day-of-month month day-of-week), evaluated in UTC.

    Fields take ``*``, ``N``, ``N-M``, comma lists and ``/STEP``; day of week
    is 0-7 with 0 and 7 both Sunday. As in cron, when both day fields are
    restricted a day matches if either does.
    """

    __slots__ = ("_any_dom", "_any_dow", "_days", "_hours", "_minutes", "_months", "_weekdays", "text")

    def __init__(self, text: str) -> None:
        fields = text.split()
        if len(fields) != 5:
            raise InvalidRecord(f"cron {text!r}: expected five fields (minute hour day month weekday)")
        parsed = [_field(f, *spec) for f, spec in zip(fields, _FIELDS, strict=True)]
        self.text = text
        self._minutes = sorted(parsed[0])
        self._hours = sorted(parsed[1])
        self._days, self._months = parsed[2], parsed[3]
        self._weekdays = frozenset(d % 7 for d in parsed[4])
        self._any_dom, self._any_dow = fields[2] == "*", fields[4] == "*"

    def _day_matches(self, day_ms: int) -> bool:
        tm = time.gmtime(day_ms // 1000)
        if tm.tm_mon not in self._months:
            return False
        dom = tm.tm_mday in self._days
        dow = (tm.tm_wday + 1) % 7 in self._weekdays  # tm_wday: Monday is 0; cron: Sunday is 0
        if self._any_dom or self._any_dow:
            return dom and dow
        return dom or dow

    def _times(self, day_ms: int) -> Iterator[int]:
        for hour in self._hours:
            for minute in self._minutes:
                yield day_ms + hour * 3_600_000 + minute * _MINUTE_MS

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        day = t_ms - t_ms % _DAY_MS
        for offset in range(_SEARCH_DAYS):
            candidate = day + offset * _DAY_MS
            if self._day_matches(candidate):
                for tick in self._times(candidate):
                    if tick > t_ms:
                        return tick
        raise InvalidRecord(f"cron {self.text!r} never fires (no matching day within eight years)")

    def latest_at(self, t_ms: int) -> int | None:
        """The last tick at or before ``t_ms`` (``None`` if none within eight years)."""
        day = t_ms - t_ms % _DAY_MS
        for offset in range(_SEARCH_DAYS):
            candidate = day - offset * _DAY_MS
            if self._day_matches(candidate):
                ticks = [tick for tick in self._times(candidate) if tick <= t_ms]
                if ticks:
                    return ticks[-1]
        return None


@final
class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow started once per tick (see the module docstring).

    ``name`` identifies the schedule for good: its runs' ids derive from it,
    so renaming it starts a new series. Give exactly one of ``every_ms`` and
    ``cron``.
    """

    name: str
    spec: WorkflowSpec
    every_ms: int | None = None
    offset_ms: int = 0
    cron: str | None = None
    input: JsonValue = None
    queue: str = "default"
    catchup_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or _NAME.fullmatch(self.name) is None:
            raise InvalidRecord(f"schedule name {self.name!r:.80} must match {_NAME.pattern}")
        if (self.every_ms is None) == (self.cron is None):
            raise InvalidRecord(f"schedule {self.name}: give exactly one of every_ms and cron")
        if self.every_ms is not None and not 1_000 <= self.every_ms <= 366 * _DAY_MS:
            raise InvalidRecord(f"schedule {self.name}: every_ms must be in [1000, {366 * _DAY_MS}]")
        if self.every_ms is not None and not 0 <= self.offset_ms < self.every_ms:
            raise InvalidRecord(f"schedule {self.name}: offset_ms must be in [0, every_ms)")
        if self.cron is not None:
            Cron(self.cron)  # refuse a malformed expression when the schedule is made
        if self.catchup_ms is not None and not 0 <= self.catchup_ms <= 366 * _DAY_MS:
            raise InvalidRecord(f"schedule {self.name}: catchup_ms must be in [0, {366 * _DAY_MS}] or None")
        if QUEUE_NAME.fullmatch(self.queue) is None:
            raise InvalidRecord(
                f"schedule {self.name}: queue {self.queue!r:.80} must match {QUEUE_NAME.pattern}"
            )

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        if self.every_ms is not None:
            return t_ms - (t_ms - self.offset_ms) % self.every_ms + self.every_ms
        assert self.cron is not None
        return Cron(self.cron).next_after(t_ms)

    def latest_at(self, t_ms: int) -> int | None:
        """The last tick at or before ``t_ms``."""
        if self.every_ms is not None:
            return t_ms - (t_ms - self.offset_ms) % self.every_ms
        assert self.cron is not None
        return Cron(self.cron).latest_at(t_ms)

    def due(self, after_ms: int | None, now_ms: int) -> list[int]:
        """The ticks to start at ``now_ms`` after a last look at ``after_ms`` (``None``: a first look).

        Every tick in ``(after_ms, now_ms]``; on a first look, the ticks within
        ``catchup_ms`` before now, or (``catchup_ms=None``) only the latest one.
        At most 1,000 ticks, the latest ones.
        """
        if after_ms is None:
            if self.catchup_ms is None:
                latest = self.latest_at(now_ms)
                return [] if latest is None else [latest]
            after_ms = now_ms - self.catchup_ms - 1
        ticks: list[int] = []
        tick = self.next_after(after_ms)
        while tick <= now_ms:
            ticks.append(tick)
            tick = self.next_after(tick)
        return ticks[-1000:]

    def run_input(self, tick_ms: int) -> JsonValue:
        """The input of the tick's run."""
        return {"scheduled_at_ms": tick_ms, "input": self.input}


def check_schedules(schedules: Sequence[object]) -> tuple[Schedule, ...]:
    """Validate a worker's ``schedules``: Schedule values with distinct names."""
    result: list[Schedule] = []
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise InvalidRecord(f"schedules must be Schedule values, got {type(schedule).__name__}")
        result.append(schedule)
    names = [s.name for s in result]
    if len(set(names)) != len(names):
        raise InvalidRecord(f"schedule names must be distinct, got {sorted(names)}")
    return tuple(result)
