"""An example third-party Mayfly backend: journal and recovery leases on SQLite, built on the backend kit.

Everything a backend needs is here, in one module:

1. ``MAYFLY_PLUGIN_API = 1`` and the two hook implementations, from
   :func:`mayfly.backend.backend_hooks`, offering the ``sqlite`` scheme;
2. :func:`parse_url`, the kit's URL parser told the URL's shape;
3. :class:`SqliteJournal`, a :class:`mayfly.backend.JournalBase`: the kit
   validates every argument and words every error, and this class only
   stores rows. Compare-and-append, replay, conflict and fencing rules run
   inside one ``BEGIN IMMEDIATE`` transaction, reads are checksum-verified
   windows, plus snapshots, run purging and the fault-injection hooks;
4. :class:`SqliteLeaseStore` and :class:`SqliteLeaseGuard`, on the kit's lease
   bases: expiring leases and a fencing counter stored in the same database,
   so the journal checks tokens in the same transaction that appends; the
   store lists its live leases (feature ``lease_listing``) with one read;
5. the run index workers claim runs from (feature ``run_index``, see
   :mod:`mayfly.runindex`): one row per run in ``mayfly_run_index``, written
   in the same transaction as the records it derives from, so no crash can
   separate them and a wake-up is never lost; ``claim`` selects and leases in
   one ``BEGIN IMMEDIATE`` transaction, so no run is handed out twice;
6. prompt wake-ups for idle workers (feature ``run_wakeups``): one FIFO per
   listening worker in ``PATH.wakeups/``, written into by whoever makes a run
   claimable now. Only latency depends on them, never correctness.

Durability: WAL mode with ``synchronous=FULL`` syncs the WAL on every commit,
so an acknowledged append survives a process or host crash: ``durable``.

The hub: SQLite has no socket, and its calls are short, so they run inline on
the calling greenlet and never switch inside a transaction. A write that
waits for another process's lock waits inline too (up to the 60 s busy
timeout); a backend whose waits can be long should cross
``mayfly.substrate.offload`` instead (see ``docs/writing-a-backend.md``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import msgspec

from mayfly.backend import (
    BackendURL,
    FifoWakeupListener,
    JournalBase,
    LeaseGuardBase,
    LeaseStoreBase,
    backend_hooks,
    decode_snapshot,
    encode_snapshot,
    notify_fifo_wakeups,
    parse_backend_url,
)
from mayfly.errors import DurabilityUnavailable, InvalidRecord, JournalUnavailable, LeaseHeld
from mayfly.ids import parse_run_id
from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
)
from mayfly.lease import LeaseCapabilities, LeaseInfo, RecoveryLeaseGuard, validate_acquire
from mayfly.runindex import IndexEntry, IndexStatus, check_claim

__all__ = [
    "MAYFLY_PLUGIN_API",
    "SqliteJournal",
    "SqliteLeaseGuard",
    "SqliteLeaseStore",
    "parse_url",
]

MAYFLY_PLUGIN_API = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-example-sqlite"

CAPABILITIES: Final = JournalCapabilities.declare(
    Durability.DURABLE,
    "cross_process fencing crash_durable fault_injection snapshots lease_expiry run_purge",
    "run_index run_wakeups",
)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS mayfly_records (
    run_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    checksum TEXT NOT NULL,
    PRIMARY KEY (run_id, sequence),
    UNIQUE (run_id, event_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mayfly_fences (
    run_id TEXT PRIMARY KEY, token INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mayfly_leases (
    run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mayfly_snapshots (
    run_id TEXT PRIMARY KEY, body BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mayfly_run_index (
    run_id TEXT PRIMARY KEY, queue TEXT NOT NULL, status TEXT NOT NULL, ready_at INTEGER,
    sequence INTEGER NOT NULL, wake INTEGER NOT NULL, parent TEXT, priority INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS mayfly_run_index_claim
    ON mayfly_run_index (queue, status, ready_at) WHERE parent IS NULL;
"""
_ENTRY: Final = "run_id, queue, status, ready_at, sequence, wake, parent, priority"
# Store an entry unless the stored one reflects a later sequence; a stored wake is kept (a claim clears it).
_PUT_ENTRY: Final = f"""
INSERT INTO mayfly_run_index ({_ENTRY}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id) DO UPDATE SET
    queue = excluded.queue, status = excluded.status, ready_at = excluded.ready_at,
    sequence = excluded.sequence, wake = max(wake, excluded.wake), parent = excluded.parent,
    priority = excluded.priority
WHERE excluded.sequence >= mayfly_run_index.sequence
"""
# Claimable at ? (now): a root run with work now, due, or woken. Higher priority first, then first come.
_CLAIMABLE: Final = """
SELECT i.run_id FROM mayfly_run_index AS i LEFT JOIN mayfly_leases AS l ON l.run_id = i.run_id
WHERE i.parent IS NULL {queues}
  AND (i.status IN ('new', 'running') OR (i.status = 'waiting' AND (i.ready_at <= ? OR i.wake = 1)))
  AND (l.run_id IS NULL OR l.expires_ms <= ?)
ORDER BY i.priority DESC, i.ready_at IS NULL, i.ready_at, i.run_id
LIMIT ?
"""


class SqliteOptions(msgspec.Struct, frozen=True, kw_only=True):
    """``sqlite://`` URLs take no options: the database file is the whole configuration."""


def parse_url(url: object) -> BackendURL[SqliteOptions]:
    """Parse ``sqlite:///PATH``; anything else raises ``InvalidBackendURL`` saying what is wrong."""
    return parse_backend_url(url, SqliteOptions, "sqlite:///PATH to a database file", kind="path")


def _now_ms() -> int:
    # Wall-clock milliseconds: leases are compared across processes on one host.
    return time.time_ns() // 1_000_000


class _Database:
    """One SQLite connection in WAL + synchronous=FULL mode, serialised by a lock."""

    def __init__(self, url: str) -> None:
        parsed = parse_url(url)
        self.url = parsed.url
        self.path = Path(parsed.location)
        try:
            self._connection = sqlite3.connect(
                parsed.location, isolation_level=None, check_same_thread=False, timeout=60
            )
            mode = self._connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._connection.execute("PRAGMA synchronous=FULL")
            synchronous = self._connection.execute("PRAGMA synchronous").fetchone()[0]
            # Refuse to claim "durable" if SQLite did not accept the settings.
            if str(mode).lower() != "wal" or synchronous != 2:
                raise DurabilityUnavailable(
                    f"{self.url}: SQLite refused WAL/synchronous=FULL (got {mode}, {synchronous})"
                )
            self._connection.executescript(_SCHEMA)
        except sqlite3.Error as error:
            raise JournalUnavailable(f"cannot open {self.url}: {error}") from None
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run the block in a ``BEGIN IMMEDIATE`` transaction: one writer at a time, across processes."""
        with self._lock:
            try:
                self._connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise JournalUnavailable(f"{self.url}: cannot begin: {error}") from None
            try:
                yield self._connection
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            try:
                self._connection.execute("COMMIT")
            except sqlite3.Error as error:
                raise JournalUnavailable(f"{self.url}: commit failed: {error}") from None

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """Give the block the connection for reads (autocommit: each statement sees a snapshot)."""
        with self._lock:
            try:
                yield self._connection
            except sqlite3.Error as error:
                raise JournalUnavailable(f"{self.url}: read failed: {error}") from None

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._connection.close()


def _fence(connection: sqlite3.Connection, run_id: str) -> int:
    row = connection.execute("SELECT token FROM mayfly_fences WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0]) if row else 0


def _holder(connection: sqlite3.Connection, run_id: str, now: int) -> str | None:
    """The owner of the run's unexpired lease, if any."""
    row = connection.execute(
        "SELECT owner, expires_ms FROM mayfly_leases WHERE run_id = ?", (run_id,)
    ).fetchone()
    return str(row[0]) if row is not None and int(row[1]) > now else None


def _queue_filter(queues: tuple[str, ...] | None) -> tuple[str, tuple[str, ...]]:
    """The ``AND i.queue IN (...)`` clause and its parameters (nothing for every queue)."""
    if queues is None:
        return "", ()
    return f"AND i.queue IN ({', '.join('?' * len(queues))})", queues


def _entry_row(entry: IndexEntry) -> tuple[object, ...]:
    return (
        entry.run_id,
        entry.queue,
        entry.status.value,
        entry.ready_at_ms,
        entry.sequence,
        int(entry.wake),
        entry.parent,
        entry.priority,
    )


def _entry_of(row: tuple[Any, ...]) -> IndexEntry:
    run_id, queue, status, ready_at, sequence, wake, parent, priority = row
    return IndexEntry(
        run_id=run_id,
        queue=queue,
        status=IndexStatus(status),
        ready_at_ms=ready_at,
        sequence=sequence,
        wake=bool(wake),
        parent=parent,
        priority=priority,
    )


_FIELDS: Final = ("sequence", "event_id", "event_type", "schema_version", "payload", "checksum")
_COLUMNS: Final = ", ".join(_FIELDS)


class SqliteJournal(JournalBase):
    """A ``WorkflowJournal`` on SQLite: one row per record, CAS and fencing in one transaction."""

    remedy = "restore the database from a backup"

    def __init__(self, url: str) -> None:
        self._db = _Database(url)
        self._leases: SqliteLeaseStore | None = None
        self._wakeups = self._db.path.with_name(self._db.path.name + ".wakeups")
        self._leases_lock = threading.Lock()
        super().__init__(url=self._db.url, capabilities=CAPABILITIES)

    def _record(self, run_id: str, row: tuple[Any, ...]) -> JournalRecord:
        """The verified record of one row, read under ``run_id``: any damage raises ChecksumMismatch.

        The checksum covers every column and the run id the row was selected by.
        SQLite keeps whatever type a damaged column was given, so a value of the
        wrong type is damage too (the kit's ``verified`` says so).
        """
        return self.verified(JournalRecord(run_id=run_id, **dict(zip(_FIELDS, row, strict=True))))

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        return self._append_rows(run_id, expected_next, batch, fence, None)

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        return self._append_rows(run_id, expected_next, batch, fence, entry)

    def _append_rows(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry] | None,
    ) -> AppendResult:
        """Compare, fence and insert the batch, and store its index entry, all in one transaction."""
        with self._db.transaction() as connection:
            self.check_fence(run_id, fence, _fence(connection, run_id))
            (last,) = connection.execute(
                "SELECT COALESCE(MAX(sequence), 0) FROM mayfly_records WHERE run_id = ?", (run_id,)
            ).fetchone()
            # The stored rows the batch names, by sequence or by event id, read whole and verified:
            # an exact re-append must equal records that are intact, not just their checksums.
            stored = [
                self._record(run_id, row)
                for row in connection.execute(
                    f"SELECT {_COLUMNS} FROM mayfly_records WHERE run_id = ? AND (sequence "
                    f"BETWEEN ? AND ? OR event_id IN ({','.join('?' * len(batch))}))",
                    (run_id, batch[0].sequence, batch[-1].sequence, *(r.event_id for r in batch)),
                )
            ]
            by_sequence = {record.sequence: record for record in stored}
            by_event = {record.event_id: record.sequence for record in stored}
            if expected_next != int(last) + 1:
                return self.refused(
                    run_id,
                    expected_next,
                    batch,
                    actual_next=int(last) + 1,
                    stored_at=by_sequence.get,
                    sequence_of=by_event.get,
                )
            for record in batch:
                if record.event_id in by_event:
                    raise self.event_id_taken(run_id, record.event_id, by_event[record.event_id])
            connection.executemany(
                "INSERT INTO mayfly_records VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.run_id, r.sequence, r.event_id, r.event_type, r.schema_version, r.payload, r.checksum)
                    for r in batch
                ],
            )
            if entry is not None:
                # The batch can no longer be refused: ask for its entry now (never earlier), and store
                # it in the same transaction, so the records and the entry commit or vanish together.
                connection.execute(_PUT_ENTRY, _entry_row(entry()))
        return self.acknowledged(run_id, batch)

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        with self._db.reading() as connection:
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM mayfly_records WHERE run_id = ? AND sequence > ? "
                "ORDER BY sequence LIMIT ?",
                (run_id, after, -1 if limit is None else limit),
            ).fetchall()
        return self.window(
            run_id, after, limit, ((row[0], row) for row in rows), lambda _, row: self._record(run_id, row)
        )

    def _next_sequence(self, run_id: str) -> int:
        with self._db.reading() as connection:
            (last,) = connection.execute(
                "SELECT COALESCE(MAX(sequence), 0) FROM mayfly_records WHERE run_id = ?", (run_id,)
            ).fetchone()
        return int(last) + 1

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        with self._db.reading() as connection:
            rows = connection.execute(
                "SELECT DISTINCT run_id FROM mayfly_records WHERE run_id > ? ORDER BY run_id LIMIT ?",
                ("" if after is None else after, limit),
            ).fetchall()
        return [row[0] for row in rows]

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        with self._db.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO mayfly_snapshots VALUES (?, ?)", (run_id, encode_snapshot(snapshot))
            )

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        with self._db.reading() as connection:
            row = connection.execute(
                "SELECT body FROM mayfly_snapshots WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if row is None else decode_snapshot(run_id, bytes(row[0]))

    def _close(self) -> None:
        try:
            if self._leases is not None:
                self._leases.close()  # releases the leases its claims still hold
        finally:
            self._db.close()

    # Run purging (capabilities.run_purge).

    def purge_run(self, run_id: str) -> bool:
        """Delete the run's records, snapshot and lease grant, keeping its fencing counter."""
        run = self.open_run(run_id, "purge")
        with self._db.transaction() as connection:
            holder = _holder(connection, run, _now_ms())
            if holder is not None:
                raise LeaseHeld(run, holder)
            removed = 0
            for table in ("mayfly_records", "mayfly_snapshots", "mayfly_leases", "mayfly_run_index"):
                removed += connection.execute(f"DELETE FROM {table} WHERE run_id = ?", (run,)).rowcount
        return removed > 0

    # The run index (capabilities.run_index; mayfly.runindex.RunIndexJournal).

    def _lease_store(self) -> SqliteLeaseStore:
        """The lease store of this database, opened on the first claim: claims grant its leases."""
        self.ensure_open("claim")
        with self._leases_lock:
            if self._leases is None:
                self._leases = SqliteLeaseStore(self.url)
            return self._leases

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None = None,
    ) -> list[RecoveryLeaseGuard]:
        """Lease up to ``limit`` claimable root runs to ``owner``, selected and granted in one transaction.

        ``now_ms`` decides which waiting runs are due; whether a lease is
        still live is decided by this host's clock, as ``acquire`` does.
        """
        limit, names = check_claim(limit, queues)
        return list(self._lease_store().grant_claimable(owner, limit, ttl_ms, now_ms, names))

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest ``ready_at`` after ``now_ms`` of a waiting root run in ``queues``."""
        _, names = check_claim(1, queues)
        self.ensure_open("next wake")
        where, params = _queue_filter(names)
        with self._db.reading() as connection:
            (earliest,) = connection.execute(
                "SELECT min(i.ready_at) FROM mayfly_run_index AS i WHERE i.parent IS NULL "
                f"AND i.status = 'waiting' AND i.ready_at > ? {where}",
                (now_ms, *params),
            ).fetchone()
        return None if earliest is None else int(earliest)

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        run = self.open_run(run_id, "index read")
        with self._db.reading() as connection:
            row = connection.execute(
                f"SELECT {_ENTRY} FROM mayfly_run_index WHERE run_id = ?", (run,)
            ).fetchone()
        return None if row is None else _entry_of(row)

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries (a rebuild, a repair); a lower sequence never replaces one, a stored wake stays."""
        for entry in entries:
            if not isinstance(entry, IndexEntry):
                raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
            parse_run_id(entry.run_id)
        self.ensure_open("index write")
        with self._db.transaction() as connection:
            connection.executemany(_PUT_ENTRY, [_entry_row(entry) for entry in entries])

    def index_wake(self, run_id: str) -> bool:
        """Ask for a waiting run to be claimed; ``False`` if it has no entry or has ended."""
        run = self.open_run(run_id, "index wake")
        with self._db.transaction() as connection:
            woken = connection.execute(
                "UPDATE mayfly_run_index SET wake = 1 WHERE run_id = ? AND status != 'terminal'", (run,)
            )
        return woken.rowcount > 0

    # Prompt wake-ups (capabilities.run_wakeups; mayfly.runindex.RunWakeups).

    def listen_wakeups(self) -> FifoWakeupListener:
        """This worker's wake-up channel: a FIFO of its own in ``PATH.wakeups/``."""
        self.ensure_open("listening for wake-ups")
        return FifoWakeupListener(self._wakeups)

    def notify_wakeups(self) -> None:
        """Write one byte into every listening worker's FIFO (the backend kit's FIFO wake-ups)."""
        notify_fifo_wakeups(self._wakeups)

    # Fault injection for the contract suite (capabilities.fault_injection).

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Change a stored payload without updating its checksum."""
        with self._db.transaction() as connection:
            connection.execute(
                "UPDATE mayfly_records SET payload = CAST('\"corrupt\"' AS BLOB) "
                "WHERE run_id = ? AND sequence = ?",
                (run_id, sequence),
            )

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap."""
        with self._db.transaction() as connection:
            connection.execute(
                "DELETE FROM mayfly_records WHERE run_id = ? AND sequence = ?", (run_id, sequence)
            )

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored snapshot body."""
        with self._db.transaction() as connection:
            connection.execute(
                "UPDATE mayfly_snapshots SET body = CAST('{\"run_id\": 7' AS BLOB) WHERE run_id = ?",
                (run_id,),
            )


class SqliteLeaseGuard(LeaseGuardBase[None]):
    """A granted SQLite lease; valid until released, or expired and taken over."""

    _store: SqliteLeaseStore

    def _renew(self, ttl_ms: int) -> None:
        with self._store.db.transaction() as connection:
            row = connection.execute(
                "SELECT token FROM mayfly_leases WHERE run_id = ?", (self.run_id,)
            ).fetchone()
            if row is None or int(row[0]) != self.fencing_token:
                raise self.lost("expired and was taken over")
            connection.execute(
                "UPDATE mayfly_leases SET expires_ms = ? WHERE run_id = ?", (_now_ms() + ttl_ms, self.run_id)
            )

    def _release(self) -> None:
        with self._store.db.transaction() as connection:
            connection.execute(
                "DELETE FROM mayfly_leases WHERE run_id = ? AND token = ?", (self.run_id, self.fencing_token)
            )


class SqliteLeaseStore(LeaseStoreBase[SqliteLeaseGuard]):
    """A ``RecoveryLeaseStore`` on SQLite: expiring leases, a persistent fencing counter."""

    def __init__(self, url: str) -> None:
        self.db = _Database(url)
        super().__init__(url=self.db.url, capabilities=LeaseCapabilities.declare("lease_listing"))

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> SqliteLeaseGuard:
        with self.db.transaction() as connection:
            now = _now_ms()
            holder = _holder(connection, run_id, now)
            if holder is not None:
                raise LeaseHeld(run_id, holder)
            token = _fence(connection, run_id) + 1
            connection.execute("INSERT OR REPLACE INTO mayfly_fences VALUES (?, ?)", (run_id, token))
            connection.execute(
                "INSERT OR REPLACE INTO mayfly_leases VALUES (?, ?, ?, ?)",
                (run_id, owner, token, now + ttl_ms),
            )
        return SqliteLeaseGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=None)

    def grant_claimable(
        self, owner: str, limit: int, ttl_ms: int, now_ms: int, queues: tuple[str, ...] | None
    ) -> list[SqliteLeaseGuard]:
        """Select up to ``limit`` claimable runs and lease them to ``owner``: one transaction (a claim).

        ``BEGIN IMMEDIATE`` makes the transaction the database's only writer
        from its first statement, so two claimants (threads or processes)
        never select the same unleased run: the second one's selection sees
        the first one's leases. Each grant bumps the run's fencing counter
        and clears its ``wake``.
        """
        self.ensure_open("claim")
        where, params = _queue_filter(queues)
        guards = []
        with self.db.transaction() as connection:
            lease_now = _now_ms()
            rows = connection.execute(
                _CLAIMABLE.format(queues=where), (*params, now_ms, lease_now, limit)
            ).fetchall()
            for (run_id,) in rows:
                run, owner, ttl = validate_acquire(run_id, owner, ttl_ms)
                token = _fence(connection, run) + 1
                connection.execute("INSERT OR REPLACE INTO mayfly_fences VALUES (?, ?)", (run, token))
                connection.execute(
                    "INSERT OR REPLACE INTO mayfly_leases VALUES (?, ?, ?, ?)",
                    (run, owner, token, lease_now + ttl),
                )
                connection.execute("UPDATE mayfly_run_index SET wake = 0 WHERE run_id = ?", (run,))
                guards.append(SqliteLeaseGuard(self, run, owner, token=token, ttl_ms=ttl, grant=None))
        with self._held_lock:  # the kit's bookkeeping: close() releases what is still held
            self._held.update(guards)
        return guards

    def _current_fence(self, run_id: str) -> int:
        with self.db.reading() as connection:
            return _fence(connection, run_id)

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        """The unexpired leases after ``after`` in run id order: one read, which no writer waits for (WAL)."""
        with self.db.reading() as connection:
            now = _now_ms()
            rows = connection.execute(
                "SELECT run_id, owner, token, expires_ms FROM mayfly_leases "
                "WHERE run_id > ? AND expires_ms > ? ORDER BY run_id LIMIT ?",
                ("" if after is None else after, now, limit),
            ).fetchall()
        return [
            LeaseInfo(
                run_id=run,
                owner=owner,
                fencing_token=int(token),
                expires_at_ms=int(expires),
                expires_in_ms=int(expires) - now,
            )
            for run, owner, token, expires in rows
        ]

    def _close(self) -> None:
        self.db.close()


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    ("sqlite",),
    DISTRIBUTION,
    SqliteJournal,
    SqliteLeaseStore,
    summary="SQLite journal and expiring leases (WAL, synchronous=FULL: durable)",
)
