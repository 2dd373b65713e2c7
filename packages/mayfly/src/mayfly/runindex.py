"""The run index: derived, per-run scheduling data that workers claim runs from.

Beside each run's history a backend that declares the ``run_index`` feature
keeps one :class:`IndexEntry`: whether the run has work now, when it next
wakes, its queue, and whether someone asked to wake it. Like a snapshot, an
entry is derived data: :func:`index_entry` computes it from a run's state,
and the whole index can be rebuilt from the journals. Unlike a snapshot it
is what makes a run *found*: a worker claims only what the index says is
claimable, so the index is written in the same atomic step as the append
that changes it (a transaction, a script, one write order), and a wake-up is
never lost.

Claimable at wall time ``now`` (:class:`RunIndexJournal.claim`):

* ``new`` or ``running`` — the run has work to do now (ready nodes, attempts
  in flight, an accepted signal to re-invoke, a child run to drive);
* ``waiting`` with ``ready_at_ms <= now`` (a retry release, an attempt or
  signal deadline) or with ``wake`` set (a signal, or a parked child woke);

and no live lease on it: never leased, released, or expired. Child runs are
driven by their parent's driver, so entries with a ``parent`` are never
claimed themselves. Each claim grants the run's recovery lease (with a new
fencing token) in the same atomic step as the selection, so two claimants
never get the same run; fencing on every append stays the safety net.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final, Protocol, final, runtime_checkable

import msgspec

from mayfly.journal import AppendResult, Feature, JournalRecord
from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import ParentLink
from mayfly.model.ids import QUEUE_NAME
from mayfly.model.state import RunStatus
from mayfly.reducer.deadlines import DeadlineView, next_deadline

__all__ = [
    "MAX_CLAIM",
    "RUN_INDEX",
    "RUN_WAKEUPS",
    "IndexEntry",
    "IndexStatus",
    "IndexedRun",
    "RunIndexJournal",
    "RunWakeups",
    "WakeupListener",
    "check_claim",
    "index_entry",
    "more_claimable",
]


class IndexStatus(enum.StrEnum):
    """What a run needs from a worker."""

    NEW = "new"
    """Created, never driven."""
    RUNNING = "running"
    """Has work to do now: ready nodes, attempts in flight, an accepted signal, a child to drive."""
    WAITING = "waiting"
    """Nothing to do before ``ready_at_ms`` (a retry, a deadline), or until someone wakes it."""
    TERMINAL = "terminal"
    """Ended; never claimed again."""


@final
class IndexEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One run's index entry (see the module docstring for when it is claimable).

    ``ready_at_ms`` is wall-clock Unix milliseconds: for ``new``/``running``
    the time the run became runnable (claims are first come, first served),
    for ``waiting`` its next wake time (``None``: only a wake can end the
    wait), for ``terminal`` ``None``. ``sequence`` is the journal sequence the
    entry reflects: a store never replaces an entry with one of a lower
    sequence, so a late writer cannot undo a newer fact. ``wake`` asks for the
    run to be claimed although it waits (a signal arrived, a parked child
    woke); only a claim clears it. ``parent`` is set on child runs.
    ``priority`` and ``dedup_id`` come from the run's creation (see
    :mod:`mayfly.queues`). ``started_ms`` is the wall time of the run's first
    claim, recorded by a ``queue_control`` backend's claim and kept by every
    later write of the entry; :func:`index_entry` leaves it ``None``.
    """

    run_id: str
    queue: str = "default"
    status: IndexStatus
    ready_at_ms: int | None
    sequence: int
    wake: bool = False
    parent: str | None = None
    priority: int = 0
    dedup_id: str | None = None
    started_ms: int | None = None


MAX_CLAIM = 10_000
"""The most runs one claim may ask for."""


def check_claim(limit: object, queues: object) -> tuple[int, tuple[str, ...] | None]:
    """Validate a claim's ``limit`` and ``queues`` (every backend calls this first); raise InvalidRecord."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
        raise InvalidRecord(f"claim limit must be an int in [1, {MAX_CLAIM}], got {limit!r}")
    if queues is None:
        return limit, None
    if isinstance(queues, str | bytes) or not isinstance(queues, Sequence):
        raise InvalidRecord(f"queues must be a sequence of queue names, got {type(queues).__name__}")
    names = tuple(queues)
    for name in names:
        if not isinstance(name, str) or QUEUE_NAME.fullmatch(name) is None:
            raise InvalidRecord(f"queue name {name!r:.80} must match {QUEUE_NAME.pattern}")
    if not names:
        raise InvalidRecord("queues must name at least one queue (None means every queue)")
    return limit, names


_RANK = {IndexStatus.NEW: 0, IndexStatus.RUNNING: 0, IndexStatus.WAITING: 1, IndexStatus.TERMINAL: 2}


class IndexedRun(DeadlineView, Protocol):
    """What :func:`index_entry` reads: a RunState, or a decision's draft (the run after its batch)."""

    @property
    def run_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def dedup_id(self) -> str | None: ...
    @property
    def epoch_ms(self) -> int | None: ...
    @property
    def parent(self) -> ParentLink | None: ...
    @property
    def status(self) -> RunStatus: ...
    @property
    def sequence(self) -> int: ...
    @property
    def now(self) -> int: ...
    @property
    def attempt_count(self) -> int: ...
    @property
    def has_ready(self) -> bool: ...
    @property
    def active_count(self) -> int: ...
    @property
    def waiting_count(self) -> int: ...


def index_entry(state: IndexedRun, *, parked_until: int | None = None, parked: bool = False) -> IndexEntry:
    """The index entry a run in ``state`` has: a pure function of the state (no clock).

    A driver that detaches a run whose only work is in parked child runs
    passes ``parked=True`` (the run then waits instead of being ``running``)
    and ``parked_until``, the children's earliest wake time (wall ms).
    """
    epoch = state.epoch_ms
    if state.status.is_terminal:
        status, ready_at = IndexStatus.TERMINAL, None
    elif state.attempt_count == 0 and not parked:
        status, ready_at = IndexStatus.NEW, (epoch or 0) + state.now
    elif not parked and (state.has_ready or state.active_count > state.waiting_count):
        # Ready nodes, an attempt in flight (or a child run to drive), an accepted signal to re-invoke.
        status, ready_at = IndexStatus.RUNNING, (epoch or 0) + state.now
    else:
        deadline = next_deadline(state)
        # A run recorded before epochs existed counts only driven time: wake it as soon as it has a
        # deadline, and let the driver that claims it wait for the deadline itself.
        ready_at = None if deadline is None else (0 if epoch is None else epoch + deadline)
        if parked_until is not None:
            ready_at = parked_until if ready_at is None else min(ready_at, parked_until)
        status = IndexStatus.WAITING
    return IndexEntry(
        run_id=state.run_id,
        queue=state.queue,
        status=status,
        ready_at_ms=ready_at,
        sequence=state.sequence,
        parent=None if state.parent is None else state.parent.run_id,
        priority=state.priority,
        dedup_id=state.dedup_id,
    )


def more_claimable(candidate: IndexEntry, current: IndexEntry | None) -> bool:
    """Whether ``candidate`` would make the run claimable sooner than ``current`` does.

    The file journal, which cannot write an entry and frames atomically,
    writes such a candidate *before* the frames and the exact entry after, so
    a crash between the two leaves the run spuriously claimable, never lost.
    """
    if current is None:
        return True
    if _RANK[candidate.status] != _RANK[current.status]:
        return _RANK[candidate.status] < _RANK[current.status]
    if candidate.status is IndexStatus.TERMINAL or candidate.ready_at_ms is None:
        return False
    return current.ready_at_ms is None or candidate.ready_at_ms < current.ready_at_ms


@runtime_checkable
class RunIndexJournal(Protocol):
    """A journal that keeps the run index (the declared ``run_index`` feature).

    ``url`` is the journal's (as :class:`~mayfly.journal.WorkflowJournal`).

    ``append`` takes the run's new entry as ``index=`` and writes it in the
    same atomic step as the records. The other methods read and repair the
    index and claim runs from it.
    """

    @property
    def url(self) -> str:
        """The store URL, without any password."""
        ...

    def append_indexed(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None,
        index: Callable[[], IndexEntry],
    ) -> AppendResult:
        """Append like ``append`` and store the run's new entry in the same atomic step.

        ``index()`` returns the entry the run has once the batch is appended.
        It changes nothing (:func:`mayfly.commit.commit_command` reads it off
        the draft the batch was decided on), so a backend may ask for it at
        any point, before its compare and fencing checks too (to send entry
        and records in one request), and stores it only if the batch is
        appended; a refused append stores no entry. It costs a little: ask
        once. An exact re-append (``already_committed``) need not ask at all.
        """
        ...

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None = None,
    ) -> list[RecoveryLeaseGuard]:
        """Lease up to ``limit`` root runs claimable at ``now_ms`` to ``owner``, in ``ready_at_ms`` order.

        Each returned guard holds the run's recovery lease (TTL ``ttl_ms``)
        with a fresh fencing token, taken atomically with the selection: no
        run is handed to two claimants. A claim clears the run's ``wake``.
        ``queues`` limits the claim to those queues (``None``: every queue).
        """
        ...

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest ``ready_at_ms`` after ``now_ms`` of a waiting root run (idle workers sleep to it)."""
        ...

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's entry, or ``None`` if it has none."""
        ...

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries (a rebuild, a repair, a detaching driver).

        An entry with a lower sequence never replaces a stored one, and a
        stored ``wake`` is kept (only a claim clears it).
        """
        ...

    def index_wake(self, run_id: str) -> bool:
        """Set the run's ``wake`` so a worker claims it; ``False`` if it has no entry or has ended."""
        ...


RUN_INDEX: Final[Feature[RunIndexJournal]] = Feature("run_index", RunIndexJournal)
"""The run index as a declared journal feature: ``RUN_INDEX.of(journal)`` is the journal or ``None``."""


@runtime_checkable
class WakeupListener(Protocol):
    """One worker's wake-up channel: readable when a run became claimable now."""

    def fileno(self) -> int:
        """The descriptor to wait on for readability (on the hub)."""
        ...

    def drain(self) -> None:
        """Consume the pending wake-ups."""
        ...

    def close(self) -> None:
        """Stop listening."""
        ...


@runtime_checkable
class RunWakeups(Protocol):
    """Prompt wake-ups for idle workers (the declared ``run_wakeups`` feature).

    Not needed for correctness, only for latency: a worker that misses one
    finds the run at its next poll.
    """

    def listen_wakeups(self) -> WakeupListener:
        """Open this worker's wake-up channel."""
        ...

    def notify_wakeups(self) -> None:
        """Tell every listening worker that some run became claimable now (after its lease was released)."""
        ...


RUN_WAKEUPS: Final[Feature[RunWakeups]] = Feature("run_wakeups", RunWakeups)
"""Prompt wake-ups as a declared journal feature."""
