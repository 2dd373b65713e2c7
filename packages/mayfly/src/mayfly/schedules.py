"""Durable schedules: a workflow started once per tick, however many workers serve the schedule.

A :class:`Schedule` names a specification and when it fires: ``every_ms``
(ticks at whole multiples of the period since the Unix epoch, plus
``offset_ms``) or a five-field ``cron`` expression in UTC. Workers serve two
kinds of schedules:

* **Stored schedules**, kept durably in the journal by a backend that declares
  the ``schedule_store`` feature (:data:`SCHEDULE_STORE`): added with
  :func:`add_schedule` (or ``mayfly schedule add``), listed and removed the
  same way. Every worker of the journal re-reads them at its poll interval, so
  a schedule added or removed on one host starts or stops firing on every
  worker within one poll interval, with no restart and no file to copy (the
  specification is stored whole).
* **Code schedules**, given to workers in code: ``Worker(..., schedules=[...])``
  or ``schedules`` in the handlers module of ``mayfly worker``. A name that is
  both in code and in the journal is served from the code; the worker logs the
  clash once.

Exactly one run per tick, with no coordination between workers: a tick's run
id is derived from the schedule's name and the tick's time (a UUIDv5, see
:func:`tick_run_id`), and :meth:`~mayfly.runtime.WorkflowRuntime.start` with
a chosen run id creates the run once and returns the existing run to every
later caller, so two workers racing for a tick create one run.

Catch-up (``catch_up``) decides what a worker does, when it first looks at a
schedule (it starts, or the schedule is new to it), with the *missed* ticks:
those after the schedule's last started tick (recorded in the store; advisory),
after its definition was stored (added, or replaced), and within ``catchup_ms``
when that is set.

* ``"skip"``: no missed tick is started; the schedule fires from now on.
* ``"one"`` (the default): the latest missed tick is started, once, so a
  schedule every worker missed for a day runs once, not 1,440 times.
* ``"all"``: every missed tick is started, oldest first, at most
  :data:`MAX_CATCH_UP` (1,000) of them: beyond that the latest 1,000 are
  started and the worker logs that older ones were left out.

A code schedule has no stored record of its last tick, so ``"all"`` needs
``catchup_ms`` there; a code schedule that sets ``catchup_ms`` and no
``catch_up`` catches up every tick within that window (what ``catchup_ms``
meant before the policies). While a worker serves a schedule it starts every
tick as it comes, whatever the policy.

The run's input is ``{"scheduled_at_ms": TICK, "input": INPUT}``: a handler
reads the tick it runs for from ``request.run_input``.

Cron expressions are parsed here (:class:`Cron`, table-tested), not by a
library: the five-field UTC subset needs no timezone or calendar rules, and
the core takes no new runtime dependency for it.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import re
import time
import uuid
from collections.abc import Sequence
from typing import Final, Literal, Protocol, final, runtime_checkable

import cronsim
import msgspec

from mayfly.journal import Feature, WorkflowJournal
from mayfly.model.errors import (
    CompatibilityError,
    CorruptionError,
    InvalidRecord,
    JournalError,
    SpecValidationError,
)
from mayfly.model.ids import QUEUE_NAME
from mayfly.model.json import JsonValue
from mayfly.model.spec import WorkflowSpec
from mayfly.reducer import validate

__all__ = [
    "CATCH_UP_POLICIES",
    "MAX_CATCH_UP",
    "SCHEDULE_FORMAT",
    "SCHEDULE_STORE",
    "CatchUp",
    "Cron",
    "Schedule",
    "ScheduleConflict",
    "ScheduleStore",
    "StoredSchedule",
    "TickPlan",
    "add_schedule",
    "check_schedule_name",
    "check_schedules",
    "check_tick",
    "decode_schedule",
    "encode_schedule",
    "get_schedule",
    "list_schedules",
    "next_stored",
    "remove_schedule",
    "schedule_store",
    "tick_run_id",
]

_NAMESPACE: Final = uuid.UUID("6f1b7a52-0d38-5a0e-9c41-6d61796c7921")
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_.:-]{0,127}")
_MINUTE_MS: Final = 60_000
_DAY_MS: Final = 86_400_000
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MAX_TICK_MS: Final = 2**53  # ticks are JSON integers every reader decodes exactly

MAX_CATCH_UP: Final = 1_000
"""The most missed ticks ``catch_up="all"`` starts at once (the latest ones)."""

CatchUp = Literal["skip", "one", "all"]
CATCH_UP_POLICIES: Final[tuple[CatchUp, ...]] = ("skip", "one", "all")
"""The catch-up policies, as ``--catch-up`` takes them."""

SCHEDULE_FORMAT: Final = 1
"""The format version of a stored schedule's bytes (:func:`encode_schedule`)."""


def tick_run_id(schedule: str, tick_ms: int) -> str:
    """The run id of ``schedule``'s run for the tick at ``tick_ms``: the same in every process."""
    return str(uuid.uuid5(_NAMESPACE, f"mayfly-schedule:{schedule}:{tick_ms}"))


def check_schedule_name(name: object) -> str:
    """``name`` if it is a valid schedule name (every backend checks with it); raise InvalidRecord."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidRecord(f"schedule name {name!r:.80} must match {_NAME.pattern}")
    return name


def check_tick(tick_ms: object) -> int:
    """``tick_ms`` if it is a tick time (a whole number of Unix milliseconds); raise InvalidRecord."""
    if isinstance(tick_ms, bool) or not isinstance(tick_ms, int) or not 0 <= tick_ms <= _MAX_TICK_MS:
        raise InvalidRecord(f"tick_ms must be an int in [0, 2**53], got {tick_ms!r:.80}")
    return tick_ms


_CRON_FIELDS: Final = "minute hour day-of-month month day-of-week"


def _utc(t_ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=t_ms)


def _unix_ms(moment: datetime.datetime) -> int:
    return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)


@final
class Cron:
    """A five-field cron expression (minute hour day-of-month month day-of-week), evaluated in UTC.

    Parsing and iteration are cronsim's (policy/dependency-admissions.md):
    ``*``, ``N``, ``N-M``, lists, ``/STEP``, month and weekday names
    (``JAN``, ``MON-FRI``), ``L`` (the last day of the month), ``W`` and ``#``.
    Day of week is 0-7 with 0 and 7 both Sunday. As in cron, when both day
    fields are restricted a day matches if either does. An expression that
    can never fire (``0 0 31 2 *``) is refused.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        if len(text.split()) != 5:
            raise InvalidRecord(f"cron {text!r}: expected five fields ({_CRON_FIELDS}), in UTC")
        try:
            cronsim.CronSim(text, _EPOCH)
        except cronsim.CronSimError as error:
            raise InvalidRecord(
                f"cron {text!r}: {str(error).lower()}; fields are {_CRON_FIELDS} (UTC), "
                "each *, N, N-M, lists, /STEP or names such as MON-FRI"
            ) from None
        self.text = text

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        # Ticks are whole minutes; from the whole second at or before t_ms, cronsim's next tick is after t_ms.
        start = _utc(t_ms - t_ms % 1000)
        return _unix_ms(next(cronsim.CronSim(self.text, start)))

    def latest_at(self, t_ms: int) -> int | None:
        """The last tick at or before ``t_ms`` (``None`` if it would lie before the Unix epoch)."""
        # cronsim's reverse iteration yields ticks strictly before its start: start 1 ms after t_ms.
        tick = _unix_ms(next(cronsim.CronSim(self.text, _utc(t_ms + 1), reverse=True)))
        return tick if tick >= 0 else None


@functools.lru_cache(maxsize=256)
def _cron(text: str) -> Cron:
    return Cron(text)


@final
class TickPlan(msgspec.Struct, frozen=True):
    """The ticks a worker starts now (oldest first), and whether older missed ones were left out."""

    ticks: list[int]
    left_out: bool = False


@final
class Schedule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A workflow started once per tick (see the module docstring).

    ``name`` identifies the schedule for good: its runs' ids derive from it,
    so renaming it starts a new series. Give exactly one of ``every_ms`` and
    ``cron``. ``catch_up`` is ``"skip"``, ``"one"`` or ``"all"`` (``None``:
    ``"one"``, or ``"all"`` within ``catchup_ms`` when that is set);
    ``catchup_ms`` bounds how old a missed tick may be and still start.
    """

    name: str
    spec: WorkflowSpec
    every_ms: int | None = None
    offset_ms: int = 0
    cron: str | None = None
    input: JsonValue = None
    queue: str = "default"
    catchup_ms: int | None = None
    catch_up: CatchUp | None = None

    def __post_init__(self) -> None:
        check_schedule_name(self.name)
        if not isinstance(self.spec, WorkflowSpec):
            raise InvalidRecord(f"schedule {self.name}: spec must be a WorkflowSpec")
        if (self.every_ms is None) == (self.cron is None):
            raise InvalidRecord(f"schedule {self.name}: give exactly one of every_ms and cron")
        if self.every_ms is not None and not 1_000 <= self.every_ms <= 366 * _DAY_MS:
            raise InvalidRecord(f"schedule {self.name}: every_ms must be in [1000, {366 * _DAY_MS}]")
        if self.every_ms is not None and not 0 <= self.offset_ms < self.every_ms:
            raise InvalidRecord(f"schedule {self.name}: offset_ms must be in [0, every_ms)")
        if self.cron is not None:
            if self.offset_ms != 0:
                raise InvalidRecord(f"schedule {self.name}: offset_ms is for every_ms schedules, not cron")
            _cron(self.cron).next_after(0)  # refuse a malformed or never-firing expression when made
        if self.catchup_ms is not None and not 0 <= self.catchup_ms <= 366 * _DAY_MS:
            raise InvalidRecord(f"schedule {self.name}: catchup_ms must be in [0, {366 * _DAY_MS}] or None")
        if self.catch_up is not None and self.catch_up not in CATCH_UP_POLICIES:
            raise InvalidRecord(
                f"schedule {self.name}: catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, "
                f"got {self.catch_up!r:.40}"
            )
        if QUEUE_NAME.fullmatch(self.queue) is None:
            raise InvalidRecord(
                f"schedule {self.name}: queue {self.queue!r:.80} must match {QUEUE_NAME.pattern}"
            )

    @property
    def policy(self) -> CatchUp:
        """The catch-up policy in force: ``catch_up``, else ``"all"`` with ``catchup_ms``, else ``"one"``."""
        if self.catch_up is not None:
            return self.catch_up
        return "all" if self.catchup_ms is not None else "one"

    @property
    def when(self) -> str:
        """When it fires, as ``mayfly schedule list`` prints it: ``every 2s`` or ``cron 0 9 * * 1-5``."""
        if self.every_ms is None:
            return f"cron {self.cron}"
        offset = f" +{_duration(self.offset_ms)}" if self.offset_ms else ""
        return f"every {_duration(self.every_ms)}{offset}"

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        if self.every_ms is not None:
            return t_ms - (t_ms - self.offset_ms) % self.every_ms + self.every_ms
        assert self.cron is not None
        return _cron(self.cron).next_after(t_ms)

    def latest_at(self, t_ms: int) -> int | None:
        """The last tick at or before ``t_ms``."""
        if self.every_ms is not None:
            return t_ms - (t_ms - self.offset_ms) % self.every_ms
        assert self.cron is not None
        return _cron(self.cron).latest_at(t_ms)

    def _between(self, floor_ms: int, now_ms: int, limit: int) -> TickPlan:
        """The ticks in ``(floor_ms, now_ms]``: the latest ``limit``, oldest first, and whether more exist."""
        ticks: list[int] = []
        tick = self.latest_at(now_ms)
        while tick is not None and tick > floor_ms:
            if len(ticks) == limit:
                return TickPlan(ticks[::-1], left_out=True)
            ticks.append(tick)
            tick = self.latest_at(tick - 1)
        return TickPlan(ticks[::-1])

    def plan(
        self,
        after_ms: int | None,
        now_ms: int,
        *,
        last_tick_ms: int | None = None,
        stored_ms: int | None = None,
    ) -> TickPlan:
        """The ticks to start at ``now_ms`` after a last look at ``after_ms`` (``None``: a first look).

        A worker that looked at ``after_ms`` starts every tick since, at most
        :data:`MAX_CATCH_UP` (the latest). A first look applies the catch-up
        policy to the missed ticks: those after ``last_tick_ms`` (the stored
        last started tick), at or after ``stored_ms`` (when the schedule's
        definition was stored: ticks before it were another definition's) and
        within ``catchup_ms`` of now.
        """
        if after_ms is not None:
            return self._between(after_ms, now_ms, MAX_CATCH_UP)
        floors = [t for t in (last_tick_ms, None if stored_ms is None else stored_ms - 1) if t is not None]
        if self.catchup_ms is not None:
            floors.append(now_ms - self.catchup_ms - 1)
        floor = max(floors) if floors else None
        policy = self.policy
        if policy == "skip":
            on_tick = self.latest_at(now_ms) == now_ms and (floor is None or floor < now_ms)
            return TickPlan([now_ms] if on_tick else [])
        if policy == "one" or floor is None:
            if policy == "all":
                raise InvalidRecord(
                    f"schedule {self.name}: catch_up 'all' needs catchup_ms, or a stored schedule "
                    "(which records its last tick): a worker cannot tell which ticks it missed"
                )
            latest = self.latest_at(now_ms)
            return TickPlan([] if latest is None or (floor is not None and latest <= floor) else [latest])
        return self._between(floor, now_ms, MAX_CATCH_UP)

    def due(self, after_ms: int | None, now_ms: int) -> list[int]:
        """The ticks :meth:`plan` starts, with no stored record (a code schedule)."""
        return self.plan(after_ms, now_ms).ticks

    def run_input(self, tick_ms: int) -> JsonValue:
        """The input of the tick's run."""
        return {"scheduled_at_ms": tick_ms, "input": self.input}


def _duration(ms: int) -> str:
    for unit, size in (("d", _DAY_MS), ("h", 3_600_000), ("m", _MINUTE_MS), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@final
class StoredSchedule(msgspec.Struct, frozen=True, kw_only=True):
    """A schedule as a journal stores it: the definition, its version and times, and its last tick.

    ``version`` is 1 when the schedule is created and one more on each
    replace. ``last_tick_ms`` is the latest tick a worker recorded starting
    (advisory: exactly one run per tick comes from the run ids, not from it).
    """

    schedule: Schedule
    version: int
    created_ms: int
    updated_ms: int
    last_tick_ms: int | None = None

    @property
    def name(self) -> str:
        """The schedule's name."""
        return self.schedule.name


class ScheduleConflict(JournalError):
    """A conditional schedule put found another version stored (or a schedule where none was expected)."""

    def __init__(self, name: str, expected: int, actual: int) -> None:
        self.name = name
        self.expected = expected
        self.actual = actual
        if expected == 0:
            message = (
                f"schedule {name} exists already (version {actual}); to replace it, add it again with "
                "--replace (Python: add_schedule(journal, schedule, replace=True)), or remove it first"
            )
        elif actual == 0:
            message = f"schedule {name} does not exist (expected version {expected}); nothing was changed"
        else:
            message = (
                f"schedule {name} is at version {actual}, not {expected}: another writer changed it; "
                "read it again and retry"
            )
        super().__init__(message)


class _Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    sha256: str
    body: msgspec.Raw


class _FormatOnly(msgspec.Struct, frozen=True):
    format: int


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    schedule: Schedule
    version: int
    created_ms: int
    updated_ms: int


def encode_schedule(stored: StoredSchedule) -> bytes:
    """The bytes a backend stores for ``stored`` (its last tick is kept apart: see :class:`ScheduleStore`).

    A JSON envelope ``{"format": 1, "sha256": HEX, "body": {...}}``: the
    SHA-256 of the body's bytes lets :func:`decode_schedule` tell damage from
    a definition.
    """
    body = msgspec.json.encode(
        _Body(
            schedule=stored.schedule,
            version=stored.version,
            created_ms=stored.created_ms,
            updated_ms=stored.updated_ms,
        )
    )
    digest = hashlib.sha256(body).hexdigest().encode()
    return b'{"format":%d,"sha256":"%s","body":%s}' % (SCHEDULE_FORMAT, digest, body)


def decode_schedule(data: bytes, *, where: str, last_tick_ms: int | None = None) -> StoredSchedule:
    """Decode what :func:`encode_schedule` wrote; ``where`` names the stored copy in errors.

    A stored format other than :data:`SCHEDULE_FORMAT` raises
    :class:`~mayfly.errors.CompatibilityError`; bytes that are not an
    envelope, fail the checksum or hold an invalid schedule raise
    :class:`~mayfly.errors.CorruptionError`.
    """
    remedy = "restore it from a backup, or remove it and add it again with `mayfly schedule add`"
    try:
        envelope = msgspec.json.decode(data, type=_Envelope)
    except (msgspec.ValidationError, msgspec.DecodeError):
        try:
            found = msgspec.json.decode(data, type=_FormatOnly).format
        except (msgspec.ValidationError, msgspec.DecodeError):
            found = SCHEDULE_FORMAT
        if found != SCHEDULE_FORMAT:
            raise CompatibilityError(
                f"{where} has schedule format {found}; this Mayfly reads format {SCHEDULE_FORMAT}: "
                "use the Mayfly release that wrote it"
            ) from None
        raise CorruptionError(f"{where} is not a stored schedule (damaged); {remedy}") from None
    if envelope.format != SCHEDULE_FORMAT:
        raise CompatibilityError(
            f"{where} has schedule format {envelope.format}; this Mayfly reads format {SCHEDULE_FORMAT}: "
            "use the Mayfly release that wrote it"
        )
    if hashlib.sha256(envelope.body).hexdigest() != envelope.sha256:
        raise CorruptionError(f"{where} fails its checksum (damaged); {remedy}")
    try:
        body = msgspec.json.decode(envelope.body, type=_Body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise CorruptionError(f"{where} holds no valid schedule ({exc}); {remedy}") from None
    return StoredSchedule(
        schedule=body.schedule,
        version=body.version,
        created_ms=body.created_ms,
        updated_ms=body.updated_ms,
        last_tick_ms=last_tick_ms,
    )


def next_stored(
    previous: StoredSchedule | None, schedule: Schedule, *, now_ms: int, expected_version: int | None
) -> StoredSchedule:
    """What a put of ``schedule`` stores over ``previous`` (read under the backend's lock or transaction).

    Raises :class:`ScheduleConflict` when ``expected_version`` is not the
    stored version (0: no schedule of the name). Every backend's
    ``schedule_put`` uses this, so versions and times follow one rule.
    """
    actual = 0 if previous is None else previous.version
    if expected_version is not None and expected_version != actual:
        raise ScheduleConflict(schedule.name, expected_version, actual)
    return StoredSchedule(
        schedule=schedule,
        version=actual + 1,
        created_ms=now_ms if previous is None else previous.created_ms,
        updated_ms=now_ms,
        last_tick_ms=None if previous is None else previous.last_tick_ms,
    )


def check_put(schedule: object, now_ms: object, expected_version: object) -> Schedule:
    """Validate a ``schedule_put``'s arguments; return the schedule (raise InvalidRecord)."""
    if not isinstance(schedule, Schedule):
        raise InvalidRecord(f"a stored schedule must be a Schedule, got {type(schedule).__name__}")
    check_tick(now_ms)
    if expected_version is not None and (
        isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < 0
    ):
        raise InvalidRecord(f"expected_version must be None or an int >= 0, got {expected_version!r:.40}")
    return schedule


@runtime_checkable
class ScheduleStore(Protocol):
    """A journal that stores schedules durably (the ``schedule_store`` feature, :data:`SCHEDULE_STORE`).

    A schedule is stored under its name, as :func:`encode_schedule` bytes
    (so damage fails closed, with :class:`~mayfly.errors.CorruptionError`, and
    an unknown format with :class:`~mayfly.errors.CompatibilityError`), at the
    journal's durability. Its last tick is an integer kept beside it, so
    recording a tick never rewrites the definition. Bad names and arguments
    raise :class:`~mayfly.errors.InvalidRecord` and change nothing.
    """

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store ``schedule`` under its name, creating or replacing it; return what is stored.

        Follows :func:`next_stored`: version 1 on create, one more on each
        replace; the creation time and the last tick are kept. With
        ``expected_version`` (0: create only) a mismatch raises
        :class:`ScheduleConflict` and stores nothing.
        """
        ...

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        ...

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        ...

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick (it stops firing); ``False`` if there was none."""
        ...

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record that the tick's run was started: the last tick becomes the later of it and ``tick_ms``.

        ``False`` (and nothing stored) if no schedule has the name.
        """
        ...


SCHEDULE_STORE: Final[Feature[ScheduleStore]] = Feature("schedule_store", ScheduleStore)
"""Stored schedules as a declared journal feature: ``SCHEDULE_STORE.of(journal)`` is the journal or None."""

_HAS_IT: Final = "file, lmdb, postgresql, standalone redis or memory"


def schedule_store(journal: WorkflowJournal) -> ScheduleStore:
    """``journal`` as a :class:`ScheduleStore`; CompatibilityError naming the feature if it has none."""
    store = SCHEDULE_STORE.of(journal)
    if store is None:
        raise CompatibilityError(
            f"journal {journal.url} does not declare schedule_store, so it cannot keep schedules; "
            f"use one that does ({_HAS_IT}), or give the schedules to the workers in code"
        )
    return store


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def add_schedule(journal: WorkflowJournal, schedule: Schedule, *, replace: bool = False) -> StoredSchedule:
    """Store ``schedule`` in ``journal``; every worker of the journal serves it within its poll interval.

    The specification is validated first (:class:`~mayfly.errors.SpecValidationError`).
    A schedule of the same name is refused with :class:`ScheduleConflict`
    unless ``replace``; replacing keeps the series (its ticks' run ids) and
    its last tick.
    """
    if not isinstance(schedule, Schedule):
        raise InvalidRecord(f"add_schedule takes a Schedule, got {type(schedule).__name__}")
    issues = validate(schedule.spec)
    if issues:
        raise SpecValidationError(issues)
    return schedule_store(journal).schedule_put(
        schedule, now_ms=_now_ms(), expected_version=None if replace else 0
    )


def get_schedule(journal: WorkflowJournal, name: str) -> StoredSchedule | None:
    """The schedule stored in ``journal`` under ``name``, or ``None``."""
    return schedule_store(journal).schedule_get(name)


def list_schedules(journal: WorkflowJournal) -> list[StoredSchedule]:
    """Every schedule stored in ``journal``, by name."""
    return schedule_store(journal).schedule_list()


def remove_schedule(journal: WorkflowJournal, name: str) -> bool:
    """Remove the stored schedule ``name`` (workers stop it within a poll interval); ``False`` if none."""
    return schedule_store(journal).schedule_remove(name)


def check_schedules(schedules: Sequence[object]) -> tuple[Schedule, ...]:
    """Validate a worker's code ``schedules``: Schedule values with distinct names.

    ``catch_up="all"`` needs ``catchup_ms`` in code: a worker keeps no record
    of a code schedule's last tick, so it could not tell which ticks it missed.
    """
    result: list[Schedule] = []
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise InvalidRecord(f"schedules must be Schedule values, got {type(schedule).__name__}")
        if schedule.policy == "all" and schedule.catchup_ms is None:
            raise InvalidRecord(
                f"schedule {schedule.name}: catch_up 'all' in code needs catchup_ms (how far back to "
                "catch up), since a worker keeps no record of a code schedule's last tick; or store it "
                "with mayfly.schedules.add_schedule (`mayfly schedule add`)"
            )
        result.append(schedule)
    names = [s.name for s in result]
    if len(set(names)) != len(names):
        raise InvalidRecord(f"schedule names must be distinct, got {sorted(names)}")
    return tuple(result)
