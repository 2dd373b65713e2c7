"""Queues with flow control: durable settings that every worker's claims obey (the ``queue_control`` feature).

A queue is named by each run (``RunCreated.queue``); it needs no settings
until one wants flow control. :class:`QueueSettings` are stored by the
journal's backend, durably, and a backend that declares the
``queue_control`` feature (:data:`QUEUE_CONTROL`) enforces them inside its
claim, atomically with the selection, for every claimant:

* ``concurrency``: at most this many of the queue's runs are *in progress* —
  leased by some worker, live or not yet expired — across all workers. A dead
  worker's runs count until their leases expire, so the limit holds while
  workers die. A run parked on a timer or a signal holds no lease and no slot.
* ``rate_limit`` per ``rate_period_ms``: at most this many of the queue's
  runs *start* (are claimed for the first time) in any window of the period.
  Each start is recorded durably on the run's index entry (``started_ms``),
  and those records are the facts the limit is checked against.
* ``worker_concurrency``: at most this many of the queue's runs in one worker
  process. Workers pass what they hold (``held=``) to the claim.
* ``priority``: runs submitted with a priority are claimed highest first
  (then first come, first served). A queue without it refuses a submission
  with a priority other than 0, so FIFO queues stay FIFO.

A submission's ``dedup_id`` allows at most one live run with that id on its
queue: the append that would create a second one is refused with
:class:`~mayfly.errors.DuplicateRun`, which names the live run.

Limits apply to the runs workers claim. ``WorkflowRuntime.execute`` drives a
run in the foreground, under its own lease, and is not throttled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol, final, runtime_checkable

import msgspec

from mayfly.journal import Feature, WorkflowJournal
from mayfly.model.errors import CompatibilityError, InvalidRecord
from mayfly.model.ids import QUEUE_NAME
from mayfly.runindex import IndexEntry, IndexStatus

__all__ = [
    "MAX_LIMIT",
    "QUEUE_CONTROL",
    "QueueControl",
    "QueueSettings",
    "QueueUsage",
    "check_held",
    "check_queue_name",
    "check_queue_options",
    "parse_rate",
    "plan_claim",
]

MAX_LIMIT: Final = 1_000_000
"""The largest concurrency or rate limit a queue may set."""

_MAX_PERIOD_MS: Final = 30 * 24 * 3_600_000


@final
class QueueSettings(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """One queue's flow control; ``None`` (or ``False``) leaves that control off."""

    name: str
    concurrency: int | None = None
    """Runs of the queue in progress at once, across all workers."""
    worker_concurrency: int | None = None
    """Runs of the queue in progress at once in one worker process."""
    rate_limit: int | None = None
    """Starts (first claims) per ``rate_period_ms``, across all workers."""
    rate_period_ms: int | None = None
    """The rate limit's window; set together with ``rate_limit``."""
    priority: bool = False
    """Claim higher-priority submissions first (otherwise the queue is FIFO and refuses priorities)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or QUEUE_NAME.fullmatch(self.name) is None:
            raise InvalidRecord(f"queue name {self.name!r:.80} must match {QUEUE_NAME.pattern}")
        for field in ("concurrency", "worker_concurrency", "rate_limit"):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT
            ):
                raise InvalidRecord(
                    f"queue {self.name}: {field} must be an int in [1, {MAX_LIMIT}], got {value!r}"
                )
        if (self.rate_limit is None) != (self.rate_period_ms is None):
            raise InvalidRecord(
                f"queue {self.name}: rate_limit and rate_period_ms are set together (N/PERIOD)"
            )
        period = self.rate_period_ms
        if period is not None and (
            isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= _MAX_PERIOD_MS
        ):
            raise InvalidRecord(
                f"queue {self.name}: rate_period_ms must be an int in [1, {_MAX_PERIOD_MS}], got {period!r}"
            )
        if not isinstance(self.priority, bool):
            raise InvalidRecord(f"queue {self.name}: priority must be true or false, got {self.priority!r}")

    @property
    def limited(self) -> bool:
        """Whether claims from this queue are throttled across workers (a concurrency or a rate limit)."""
        return self.concurrency is not None or self.rate_limit is not None

    @property
    def rate(self) -> str | None:
        """The rate limit as ``N/PERIOD`` (``10/1s``), as ``--rate`` takes it, or ``None``."""
        if self.rate_limit is None:
            return None
        return f"{self.rate_limit}/{_period(self.rate_period_ms)}"

    def describe(self) -> str:
        """A one-line summary, as ``mayfly queue list`` prints it."""
        parts = [
            f"concurrency {self.concurrency}" if self.concurrency is not None else "concurrency unlimited",
            f"per worker {self.worker_concurrency}" if self.worker_concurrency is not None else None,
            f"rate {self.rate}" if self.rate is not None else None,
            "priorities" if self.priority else "fifo",
        ]
        return ", ".join(part for part in parts if part is not None)


def _period(ms: int | None) -> str:
    assert ms is not None
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


_UNITS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_rate(text: str) -> tuple[int, int]:
    """Parse ``N/PERIOD`` (``10/s``, ``100/1m``, ``5/500ms``) into ``(limit, period_ms)``, or ValueError."""
    count, slash, period = text.strip().partition("/")
    if not slash or not count.strip().isdigit():
        raise ValueError(f"rate {text!r} must be N/PERIOD, such as 10/s or 100/5m")
    period = period.strip()
    number = period.rstrip("msdh")
    unit = period[len(number) :]
    if unit not in _UNITS or (number and not number.isdigit()):
        raise ValueError(f"rate period {period!r} must be a duration such as s, 10s, 500ms, 5m, 1h or 1d")
    return int(count), (int(number) if number else 1) * _UNITS[unit]


@final
class QueueUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What limits a queue's next claim: runs in progress, and starts within the rate window."""

    in_progress: int = 0
    recent_starts: int = 0


def check_queue_name(name: object) -> str:
    """``name`` if it is a valid queue name (every backend's queue calls check it); raise InvalidRecord."""
    if not isinstance(name, str) or QUEUE_NAME.fullmatch(name) is None:
        raise InvalidRecord(f"queue name {name!r:.80} must match {QUEUE_NAME.pattern}")
    return name


def check_held(held: object) -> dict[str, int]:
    """Validate a claim's ``held`` (queue name -> runs this worker holds); raise InvalidRecord."""
    if held is None:
        return {}
    if not isinstance(held, Mapping):
        raise InvalidRecord(f"held must map queue names to counts, got {type(held).__name__}")
    checked: dict[str, int] = {}
    for name, count in held.items():
        if not isinstance(name, str) or QUEUE_NAME.fullmatch(name) is None:
            raise InvalidRecord(f"queue name {name!r:.80} must match {QUEUE_NAME.pattern}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidRecord(f"held count of queue {name} must be an int >= 0, got {count!r}")
        checked[name] = count
    return checked


def plan_claim(
    candidates: Sequence[IndexEntry],
    *,
    limit: int,
    settings: Mapping[str, QueueSettings],
    usage: Mapping[str, QueueUsage],
    held: Mapping[str, int],
) -> list[IndexEntry]:
    """Pick, in order, the candidates a claim may take under the queues' limits.

    ``candidates`` are claimable entries in claim order; ``usage`` is each
    limited queue's state read under the same lock (or transaction) the
    claim grants in. A backend that selects in its own language (SQL, Lua)
    implements the same rules; this is their reference.
    """
    room: dict[str, int] = {}
    starts: dict[str, int] = {}
    picked: list[IndexEntry] = []
    for entry in candidates:
        if len(picked) == limit:
            break
        queue = settings.get(entry.queue)
        if queue is None:
            picked.append(entry)
            continue
        name = entry.queue
        if name not in room:
            used = usage.get(name, QueueUsage())
            caps = [limit]
            if queue.concurrency is not None:
                caps.append(queue.concurrency - used.in_progress)
            if queue.worker_concurrency is not None:
                caps.append(queue.worker_concurrency - held.get(name, 0))
            room[name] = max(0, min(caps))
            starts[name] = (
                max(0, queue.rate_limit - used.recent_starts) if queue.rate_limit is not None else limit
            )
        if room[name] <= 0:
            continue
        first_start = entry.status is IndexStatus.NEW and entry.started_ms is None
        if first_start:
            if starts[name] <= 0:
                continue
            starts[name] -= 1
        room[name] -= 1
        picked.append(entry)
    return picked


@runtime_checkable
class QueueControl(Protocol):
    """A journal that stores queue settings and enforces them in its claims (the ``queue_control`` feature).

    Its ``claim`` (:class:`~mayfly.runindex.RunIndexJournal`) takes one more
    keyword, ``held``: the runs of each queue the claimant already holds, for
    per-worker limits. A claim of a run whose entry is ``new`` and has no
    ``started_ms`` records ``started_ms = now_ms`` on the entry in the same
    atomic step (a start). Entry writes keep a stored ``started_ms``.
    ``append_indexed`` refuses, with :class:`~mayfly.errors.DuplicateRun`, an
    entry whose ``dedup_id`` a live entry of the same queue holds.
    """

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings durably, replacing any it had; claims obey them from now on."""
        ...

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None`` if it has none (no flow control)."""
        ...

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        ...

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings (its runs are claimed without limits); ``False`` if it had none."""
        ...

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's runs in progress now and its starts within its rate window ending at ``now_ms``."""
        ...


QUEUE_CONTROL: Final[Feature[QueueControl]] = Feature("queue_control", QueueControl)
"""Queue flow control as a declared journal feature: ``QUEUE_CONTROL.of(journal)`` is the journal or None."""


def check_queue_options(journal: WorkflowJournal, queue: str, priority: int, dedup_id: str | None) -> None:
    """Refuse a submission's ``priority`` or ``dedup_id`` that ``journal`` or the queue would not honour.

    A journal without ``queue_control`` would store both and enforce neither,
    so it refuses them; a queue without priorities refuses a priority other
    than 0, so a FIFO queue stays FIFO.
    """
    control = QUEUE_CONTROL.of(journal)
    if control is None:
        wanted = "a dedup id" if dedup_id is not None else "a priority"
        raise CompatibilityError(
            f"journal {journal.url} does not declare queue_control, so it cannot honour {wanted}; "
            "use one that does (file, lmdb, postgresql, standalone redis) or submit without it"
        )
    if priority != 0:
        settings = control.queue_get(queue)
        if settings is None or not settings.priority:
            raise InvalidRecord(
                f"queue {queue} does not enable priorities, so priority {priority} would be ignored; "
                f"enable them with `mayfly queue set {queue} --priority` or submit with priority 0"
            )
