"""The in-memory backend (``memory://NAME``): journal, recovery leases and run index in one process.

Built on the backend kit (:mod:`mayfly.backend`), so every argument check and
error message is the kit's, and certified by the contract suite like any other
backend (``pytest --pyargs mayfly_contract --mayfly-journal memory://contract``).
It declares ``durability=memory`` and neither ``cross_process`` nor
``crash_durable``: nothing survives the process, and another process opening
``memory://NAME`` sees a store of its own.

One :class:`MemoryStore` holds a store's state: records, snapshots, fencing
counters, leases and index entries, under one lock. Every call is a few
dictionary operations and never switches greenlets, so calls run inline on the
hub and the lock is never held across a switch. Stores are named: a journal
and a lease store opened on the same URL share one store (the journal checks
the lease store's fencing tokens), and the store lives until
:func:`drop_store`, so closing a journal and opening the URL again finds the
records. Lease expiry is judged by the store's ``clock`` (wall milliseconds;
by default the system's), so a test on a virtual clock can expire a crashed
owner's lease by moving time.
"""

from __future__ import annotations

import heapq
import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from mayfly.backend import (
    BackendURL,
    JournalBase,
    LeaseGuardBase,
    LeaseStoreBase,
    backend_hooks,
    decode_snapshot,
    encode_snapshot,
    parse_backend_url,
)
from mayfly.journal import AppendResult, Durability, JournalCapabilities, JournalRecord, SnapshotRecord
from mayfly.lease import LeaseCapabilities, LeaseInfo, RecoveryLeaseGuard, validate_acquire
from mayfly.model.errors import DuplicateRun, InvalidBackendURL, InvalidRecord, LeaseHeld
from mayfly.model.ids import parse_run_id
from mayfly.queues import QueueSettings, QueueUsage, check_held, plan_claim
from mayfly.queues import check_queue_name as _check_queue
from mayfly.runindex import IndexEntry, IndexStatus, check_claim
from mayfly.schedules import (
    Schedule,
    StoredSchedule,
    check_put,
    check_schedule_name,
    check_tick,
    decode_schedule,
    encode_schedule,
    next_stored,
)

__all__ = [
    "MEMORY_CAPABILITIES",
    "MemoryJournal",
    "MemoryLeaseGuard",
    "MemoryLeaseStore",
    "MemoryStore",
    "drop_store",
    "memory_store",
]

MEMORY_CAPABILITIES: Final = JournalCapabilities.declare(
    Durability.MEMORY,
    "fencing fault_injection snapshots lease_expiry run_purge run_index queue_control schedule_store",
    "run_tails",
)
"""What ``memory://`` declares: no durability, no second process; fencing, expiring leases, the run index.

``run_tails`` is the backend kit's run-by-run default, certified here as the reference.
"""

_NAME: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_SHAPE: Final = "memory://NAME (NAME: [a-z0-9][a-z0-9._-]{0,62})"


class MemoryOptions(msgspec.Struct, frozen=True, kw_only=True):
    """``memory://`` URLs take no options: the name is the whole configuration."""


def parse_url(url: object) -> tuple[str, str]:
    """Parse ``memory://NAME`` into the store name and the URL; else raise ``InvalidBackendURL``."""
    parsed: BackendURL[MemoryOptions] = parse_backend_url(
        url, MemoryOptions, _SHAPE, kind="server", host_required=False
    )
    name = parsed.host or "default"
    if parsed.location.strip("/") or parsed.port is not None or parsed.username is not None:
        raise parsed.invalid("it names more than a store: give only memory://NAME")
    if _NAME.fullmatch(name) is None:
        raise parsed.invalid(f"the store name {name!r} does not match {_NAME.pattern}")
    return name, f"memory://{name}"


def _system_wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Run:
    """One run's stored history: records by sequence, the next sequence, event ids."""

    records: dict[int, JournalRecord] = field(default_factory=dict)
    head: int = 1
    event_ids: dict[str, int] = field(default_factory=dict)


@dataclass
class _Lease:
    owner: str
    token: int
    expires_ms: int


class MemoryStore:
    """The state of one in-memory store; open its journal and leases with :meth:`journal` / :meth:`leases`.

    ``clock`` returns wall milliseconds and decides when a lease expires
    (default: the system clock). A store made here is registered under its
    ``name`` (a fresh ``store-N`` if none is given), so ``memory://NAME``
    opens it too, until :func:`drop_store`.
    """

    def __init__(self, name: str | None = None, *, clock: Callable[[], int] | None = None) -> None:
        if name is None:
            name = f"store-{next(_ANONYMOUS)}"
        if _NAME.fullmatch(name) is None:
            raise InvalidBackendURL(f"memory store name {name!r} is invalid; expected {_SHAPE}")
        self.name = name
        self.clock: Callable[[], int] = clock if clock is not None else _system_wall_ms
        self.lock = threading.RLock()
        self.runs: dict[str, _Run] = {}
        self.snapshots: dict[str, bytes] = {}
        self.fences: dict[str, int] = {}
        self.leases_held: dict[str, _Lease] = {}
        self.index: dict[str, IndexEntry] = {}
        self.queues: dict[str, QueueSettings] = {}
        self.schedules: dict[str, bytes] = {}  # name -> encode_schedule bytes
        self.schedule_ticks: dict[str, int] = {}  # name -> the last tick recorded started
        with _REGISTRY_LOCK:
            if name in _REGISTRY:
                raise InvalidRecord(
                    f"memory store {name!r} exists already; open it with memory_store({name!r})"
                )
            _REGISTRY[name] = self

    @property
    def url(self) -> str:
        """``memory://NAME``."""
        return f"memory://{self.name}"

    def journal(self) -> MemoryJournal:
        """A journal on this store."""
        return MemoryJournal(self.url)

    def leases(self) -> MemoryLeaseStore:
        """A recovery-lease store on this store."""
        return MemoryLeaseStore(self.url)

    def holder(self, run_id: str) -> _Lease | None:
        """The run's unexpired lease (caller holds :attr:`lock`)."""
        lease = self.leases_held.get(run_id)
        return lease if lease is not None and lease.expires_ms > self.clock() else None

    def grant(self, run_id: str, owner: str, ttl_ms: int) -> int:
        """Grant the run's lease now with the next token (caller holds :attr:`lock`, checked it is free)."""
        token = self.fences.get(run_id, 0) + 1
        self.fences[run_id] = token
        self.leases_held[run_id] = _Lease(owner, token, self.clock() + ttl_ms)
        return token

    def usage(self, name: str, now_ms: int) -> QueueUsage:
        """The queue's runs in progress (live leases) and starts in its rate window (lock held)."""
        settings = self.queues.get(name)
        period = None if settings is None else settings.rate_period_ms
        in_progress = starts = 0
        for entry in self.index.values():
            if entry.queue != name or entry.parent is not None:
                continue
            if entry.status is not IndexStatus.TERMINAL and self.holder(entry.run_id) is not None:
                in_progress += 1
            if period is not None and entry.started_ms is not None and entry.started_ms > now_ms - period:
                starts += 1
        return QueueUsage(in_progress=in_progress, recent_starts=starts)

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r}, runs={len(self.runs)})"


_ANONYMOUS = itertools.count(1)
_REGISTRY: dict[str, MemoryStore] = {}
_REGISTRY_LOCK = threading.Lock()


def memory_store(name: str) -> MemoryStore:
    """The store named ``name``, created (with the system clock) if this process has none by that name."""
    with _REGISTRY_LOCK:
        store = _REGISTRY.get(name)
    if store is not None:
        return store
    try:
        return MemoryStore(name)
    except InvalidRecord:  # created by another thread meanwhile
        with _REGISTRY_LOCK:
            return _REGISTRY[name]


def drop_store(name: str) -> bool:
    """Forget the store named ``name`` (its data goes once no journal holds it); ``False`` if none."""
    with _REGISTRY_LOCK:
        return _REGISTRY.pop(name, None) is not None


def _store_of(url: str) -> tuple[str, MemoryStore]:
    name, redacted = parse_url(url)
    return redacted, memory_store(name)


def _claim_order(entry: IndexEntry) -> tuple[int, bool, int, str]:
    # Higher priority first, then ready_at (None last), then run id: the order every backend uses.
    return (-entry.priority, entry.ready_at_ms is None, entry.ready_at_ms or 0, entry.run_id)


class MemoryJournal(JournalBase):
    """A ``WorkflowJournal`` with the run index, in this process's memory (``memory://NAME``)."""

    remedy = "the in-memory store was damaged on purpose (fault injection); start a fresh store"

    def __init__(self, url: str) -> None:
        redacted, self.store = _store_of(url)
        self._claims: MemoryLeaseStore | None = None
        super().__init__(url=redacted, capabilities=MEMORY_CAPABILITIES)

    # -- storage hooks -----------------------------------------------------------------------

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        return self._store_batch(run_id, expected_next, batch, fence, None)

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        return self._store_batch(run_id, expected_next, batch, fence, entry)

    def _store_batch(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry] | None,
    ) -> AppendResult:
        store = self.store
        with store.lock:
            self.check_fence(run_id, fence, store.fences.get(run_id, 0))
            run = store.runs.get(run_id)
            head = 1 if run is None else run.head
            if expected_next != head:
                assert run is not None or head == 1
                records = {} if run is None else run.records
                event_ids = {} if run is None else run.event_ids

                def stored_at(sequence: int) -> JournalRecord | None:
                    record = records.get(sequence)
                    return None if record is None else self.verified(record)

                return self.refused(
                    run_id,
                    expected_next,
                    batch,
                    actual_next=head,
                    stored_at=stored_at,
                    sequence_of=event_ids.get,
                )
            if run is not None:
                for record in batch:
                    if record.event_id in run.event_ids:
                        raise self.event_id_taken(run_id, record.event_id, run.event_ids[record.event_id])
            # The batch can no longer be refused: ask for its entry now, and store both together.
            new_entry = None if entry is None else entry()
            if new_entry is not None:
                self._check_dedup(new_entry)
            if run is None:
                run = store.runs[run_id] = _Run()
            for record in batch:
                run.records[record.sequence] = record
                run.event_ids[record.event_id] = record.sequence
            run.head = batch[-1].sequence + 1
            if new_entry is not None:
                self._put(new_entry)
        return self.acknowledged(run_id, batch)

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        with self.store.lock:
            run = self.store.runs.get(run_id)
            if run is None:
                return []
            end = run.head if limit is None else min(run.head, after + 1 + limit)
            rows = [(s, run.records[s]) for s in range(after + 1, end) if s in run.records]
            head = run.head
        return self.window(
            run_id, after, limit, rows, lambda _, record: self.verified(record), next_sequence=head
        )

    def _next_sequence(self, run_id: str) -> int:
        with self.store.lock:
            run = self.store.runs.get(run_id)
            return 1 if run is None else run.head

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        with self.store.lock:
            names = sorted(run for run in self.store.runs if after is None or run > after)
        return names[:limit]

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        with self.store.lock:
            self.store.snapshots[run_id] = encode_snapshot(snapshot)

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        with self.store.lock:
            body = self.store.snapshots.get(run_id)
        return None if body is None else decode_snapshot(run_id, body)

    def _close(self) -> None:
        if self._claims is not None:
            self._claims.close()  # releases the leases its claims still hold

    # -- run purging (capabilities.run_purge) --------------------------------------------------

    def purge_run(self, run_id: str) -> bool:
        """Remove the run's records, snapshot, lease grant and index entry, keeping its fencing counter."""
        run = self.open_run(run_id, "purge")
        store = self.store
        with store.lock:
            holder = store.holder(run)
            if holder is not None:
                raise LeaseHeld(run, holder.owner)
            removed = [
                store.runs.pop(run, None),
                store.snapshots.pop(run, None),
                store.leases_held.pop(run, None),
                store.index.pop(run, None),
            ]
        return any(item is not None for item in removed)

    # -- the run index (capabilities.run_index; mayfly.runindex.RunIndexJournal) ---------------

    def _put(self, entry: IndexEntry) -> None:
        """Store ``entry`` unless the stored one reflects a later sequence; keep a stored wake (lock held)."""
        stored = self.store.index.get(entry.run_id)
        if stored is not None and entry.sequence < stored.sequence:
            return
        if stored is not None and stored.wake and not entry.wake:
            entry = msgspec.structs.replace(entry, wake=True)
        if stored is not None and stored.started_ms is not None and entry.started_ms is None:
            entry = msgspec.structs.replace(entry, started_ms=stored.started_ms)
        self.store.index[entry.run_id] = entry

    def _check_dedup(self, entry: IndexEntry) -> None:
        """Refuse an entry whose dedup id a live run of its queue holds (lock held)."""
        if entry.dedup_id is None or entry.status is IndexStatus.TERMINAL:
            return
        for other in self.store.index.values():
            if (
                other.dedup_id == entry.dedup_id
                and other.queue == entry.queue
                and other.run_id != entry.run_id
                and other.status is not IndexStatus.TERMINAL
            ):
                raise DuplicateRun(entry.run_id, entry.queue, entry.dedup_id, other.run_id)

    # -- queue flow control (capabilities.queue_control; mayfly.queues.QueueControl) -------------

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings; claims obey them from now on."""
        if not isinstance(settings, QueueSettings):
            raise InvalidRecord(f"queue settings must be a QueueSettings, got {type(settings).__name__}")
        self.ensure_open("queue settings")
        with self.store.lock:
            self.store.queues[settings.name] = settings

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None``."""
        self.ensure_open("queue settings")
        _check_queue(name)
        with self.store.lock:
            return self.store.queues.get(name)

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        self.ensure_open("queue settings")
        with self.store.lock:
            return [self.store.queues[name] for name in sorted(self.store.queues)]

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings; ``False`` if it had none."""
        self.ensure_open("queue settings")
        _check_queue(name)
        with self.store.lock:
            return self.store.queues.pop(name, None) is not None

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's runs in progress and starts within its rate window ending at ``now_ms``."""
        self.ensure_open("queue usage")
        _check_queue(name)
        with self.store.lock:
            return self.store.usage(name, now_ms)

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None = None,
        held: Mapping[str, int] | None = None,
    ) -> list[RecoveryLeaseGuard]:
        """Lease up to ``limit`` claimable root runs to ``owner``, selected and granted under one lock.

        ``now_ms`` decides which waiting runs are due and when a start is
        recorded; whether a lease is still live is decided by the store's
        clock, as ``acquire`` does. Queue limits apply (``held``: what the
        claimant holds of each queue).
        """
        limit, names = check_claim(limit, queues)
        holding = check_held(held)
        self.ensure_open("claim")
        if self._claims is None:
            self._claims = MemoryLeaseStore(self.url)
        return list(self._claims.grant_claimable(owner, limit, ttl_ms, now_ms, names, holding))

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest ``ready_at`` after ``now_ms`` of a waiting root run in ``queues``."""
        _, names = check_claim(1, queues)
        self.ensure_open("next wake")
        with self.store.lock:
            times = [
                entry.ready_at_ms
                for entry in self.store.index.values()
                if entry.parent is None
                and entry.status is IndexStatus.WAITING
                and entry.ready_at_ms is not None
                and entry.ready_at_ms > now_ms
                and (names is None or entry.queue in names)
            ]
        return min(times, default=None)

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        run = self.open_run(run_id, "index read")
        with self.store.lock:
            return self.store.index.get(run)

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries (a rebuild, a repair); a lower sequence never replaces one, a stored wake stays."""
        for entry in entries:
            if not isinstance(entry, IndexEntry):
                raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
            parse_run_id(entry.run_id)
        self.ensure_open("index write")
        with self.store.lock:
            for entry in entries:
                self._put(entry)

    def index_wake(self, run_id: str) -> bool:
        """Ask for a waiting run to be claimed; ``False`` if it has no entry or has ended."""
        run = self.open_run(run_id, "index wake")
        with self.store.lock:
            stored = self.store.index.get(run)
            if stored is None or stored.status is IndexStatus.TERMINAL:
                return False
            self.store.index[run] = msgspec.structs.replace(stored, wake=True)
            return True

    # -- stored schedules (capabilities.schedule_store; mayfly.schedules.ScheduleStore) ---------

    def _stored_schedule(self, name: str) -> StoredSchedule | None:
        data = self.store.schedules.get(name)
        if data is None:
            return None
        where = f"schedule {name} in {self.url}"
        return decode_schedule(data, where=where, last_tick_ms=self.store.schedule_ticks.get(name))

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store the schedule under its name (create or replace; versioned)."""
        check_put(schedule, now_ms, expected_version)
        self.ensure_open("schedules")
        with self.store.lock:
            stored = next_stored(
                self._stored_schedule(schedule.name),
                schedule,
                now_ms=now_ms,
                expected_version=expected_version,
            )
            self.store.schedules[schedule.name] = encode_schedule(stored)
            return stored

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        check_schedule_name(name)
        self.ensure_open("schedules")
        with self.store.lock:
            return self._stored_schedule(name)

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        self.ensure_open("schedules")
        with self.store.lock:
            found = [self._stored_schedule(name) for name in sorted(self.store.schedules)]
        return [stored for stored in found if stored is not None]

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick; ``False`` if there was none."""
        check_schedule_name(name)
        self.ensure_open("schedules")
        with self.store.lock:
            self.store.schedule_ticks.pop(name, None)
            return self.store.schedules.pop(name, None) is not None

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record a started tick (the later one wins); ``False`` if no schedule has the name."""
        check_schedule_name(name)
        check_tick(tick_ms)
        self.ensure_open("schedules")
        with self.store.lock:
            if name not in self.store.schedules:
                return False
            self.store.schedule_ticks[name] = max(tick_ms, self.store.schedule_ticks.get(name, tick_ms))
            return True

    # -- fault injection for the contract suite (capabilities.fault_injection) ------------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Change a stored payload without updating its checksum."""
        run = self.open_run(run_id, "fault injection")
        with self.store.lock:
            stored = self.store.runs[run].records[sequence]
            self.store.runs[run].records[sequence] = msgspec.structs.replace(stored, payload=b'"corrupt"')

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap."""
        run = self.open_run(run_id, "fault injection")
        with self.store.lock:
            del self.store.runs[run].records[sequence]

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored snapshot body."""
        run = self.open_run(run_id, "fault injection")
        with self.store.lock:
            self.store.snapshots[run] = b'{"run_id": 7'


class MemoryLeaseGuard(LeaseGuardBase[None]):
    """A granted in-memory lease; valid until released, or expired and taken over."""

    _store: MemoryLeaseStore

    def _renew(self, ttl_ms: int) -> None:
        store = self._store.store
        with store.lock:
            lease = store.leases_held.get(self.run_id)
            if lease is None or lease.token != self.fencing_token:
                raise self.lost("expired and was taken over")
            lease.expires_ms = store.clock() + ttl_ms

    def _release(self) -> None:
        store = self._store.store
        with store.lock:
            lease = store.leases_held.get(self.run_id)
            if lease is not None and lease.token == self.fencing_token:
                del store.leases_held[self.run_id]


class MemoryLeaseStore(LeaseStoreBase[MemoryLeaseGuard]):
    """A ``RecoveryLeaseStore`` in memory: expiring leases (by the store's clock), a fencing counter.

    Declares ``lease_listing``: the live leases, read under the store's lock
    (a few dictionary reads, never across a switch).
    """

    def __init__(self, url: str) -> None:
        redacted, self.store = _store_of(url)
        super().__init__(url=redacted, capabilities=LeaseCapabilities.declare("lease_listing"))

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        store = self.store
        with store.lock:
            now = store.clock()
            held = [
                (run_id, lease.owner, lease.token, lease.expires_ms)
                for run_id, lease in store.leases_held.items()
                if lease.expires_ms > now and (after is None or run_id > after)
            ]
        return [
            LeaseInfo(
                run_id=run_id,
                owner=owner,
                fencing_token=token,
                expires_at_ms=expires,
                expires_in_ms=expires - now,
            )
            for run_id, owner, token, expires in heapq.nsmallest(limit, held)
        ]

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> MemoryLeaseGuard:
        store = self.store
        with store.lock:
            holder = store.holder(run_id)
            if holder is not None:
                raise LeaseHeld(run_id, holder.owner)
            token = store.grant(run_id, owner, ttl_ms)
        return MemoryLeaseGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=None)

    def grant_claimable(  # noqa: PLR0917 - one internal call site passes the checked claim as is
        self,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: tuple[str, ...] | None,
        held: Mapping[str, int],
    ) -> list[MemoryLeaseGuard]:
        """Select up to ``limit`` claimable runs and lease them to ``owner`` under the store's lock."""
        self.ensure_open("claim")
        store = self.store
        guards = []
        with store.lock:
            candidates = sorted(
                (
                    entry
                    for entry in store.index.values()
                    if entry.parent is None
                    and (queues is None or entry.queue in queues)
                    and (
                        entry.status in (IndexStatus.NEW, IndexStatus.RUNNING)
                        or (
                            entry.status is IndexStatus.WAITING
                            and (
                                entry.wake or (entry.ready_at_ms is not None and entry.ready_at_ms <= now_ms)
                            )
                        )
                    )
                    and store.holder(entry.run_id) is None
                ),
                key=_claim_order,
            )
            limited = {entry.queue for entry in candidates} & set(store.queues)
            usage = {name: store.usage(name, now_ms) for name in limited}
            picked = plan_claim(candidates, limit=limit, settings=store.queues, usage=usage, held=held)
            for entry in picked:
                run, owner, ttl = validate_acquire(entry.run_id, owner, ttl_ms)
                token = store.grant(run, owner, ttl)
                started = now_ms if entry.status is IndexStatus.NEW and entry.started_ms is None else None
                store.index[run] = msgspec.structs.replace(
                    entry, wake=False, started_ms=entry.started_ms if started is None else started
                )
                guards.append(MemoryLeaseGuard(self, run, owner, token=token, ttl_ms=ttl, grant=None))
        with self._held_lock:  # the kit's bookkeeping: close() releases what is still held
            self._held.update(guards)
        return guards

    def _current_fence(self, run_id: str) -> int:
        with self.store.lock:
            return self.store.fences.get(run_id, 0)

    def _close(self) -> None:
        pass  # the store's state belongs to the store (drop_store forgets it)


def _describe(url: str) -> str:
    name, _ = parse_url(url)
    return f"in-memory store {name} of this process, durability memory"


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    ("memory",),
    "mayfly-runtime",
    MemoryJournal,
    MemoryLeaseStore,
    describe=_describe,
    summary="in-memory journal, leases and run index for tests (mayfly.testing), durability memory",
)
