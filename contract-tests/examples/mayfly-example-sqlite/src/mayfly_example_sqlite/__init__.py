"""An example third-party Mayfly backend: journal and recovery leases on SQLite.

Everything a backend needs is here, in one module:

1. ``MAYFLY_PLUGIN_API = 1`` and two hook implementations that hand Mayfly a
   :class:`~mayfly.hookspecs.BackendDescriptor` for the ``sqlite`` scheme;
2. :class:`SqliteJournal`, a ``WorkflowJournal``: input checks delegated to
   ``mayfly.journal.validate_batch``, compare-and-append, replay, conflict and
   fencing rules inside one ``BEGIN IMMEDIATE`` transaction, checksum-verified
   ordered reads, snapshots and the fault-injection hooks;
3. :class:`SqliteLeaseStore`, a ``RecoveryLeaseStore`` with expiring leases
   and a fencing counter stored in the same database, so the journal checks
   tokens in the same transaction that appends.

Durability: WAL mode with ``synchronous=FULL`` syncs the WAL on every commit,
so an acknowledged append survives a process or host crash: ``durable``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import urlsplit

import msgspec

from mayfly.hookspecs import BackendDescriptor, hookimpl
from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
    redact_url,
    validate_batch,
    validate_read,
)
from mayfly.lease import validate_acquire
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    ConflictingRecord,
    DurabilityUnavailable,
    FencingRejected,
    InvalidBackendURL,
    InvalidRecord,
    JournalGap,
    JournalUnavailable,
    LeaseHeld,
    LeaseLost,
    SnapshotCorrupt,
)
from mayfly.model.ids import parse_run_id

__all__ = ["MAYFLY_PLUGIN_API", "SqliteJournal", "SqliteLeaseGuard", "SqliteLeaseStore"]

MAYFLY_PLUGIN_API = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-example-sqlite"

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
"""


def database_path(url: str) -> str:
    """Return the database file named by ``sqlite:///PATH``."""
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in url):
        # urlsplit() would silently delete a raw CR, LF or tab and name another file.
        raise InvalidBackendURL(f"sqlite URL {url!r} holds a control character; remove it")
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path or parts.netloc or parts.query:
        raise InvalidBackendURL(f"expected sqlite:///PATH to a database file, got {url!r}")
    return parts.path


class _Database:
    """One SQLite connection in WAL + synchronous=FULL mode, serialised by a lock."""

    def __init__(self, url: str) -> None:
        self.url = redact_url(url)
        try:
            self._connection = sqlite3.connect(
                database_path(url), isolation_level=None, check_same_thread=False, timeout=60
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


_COLUMNS: Final = "sequence, event_id, event_type, schema_version, payload, checksum"


def _record(run_id: str, row: tuple[Any, ...]) -> JournalRecord:
    """The verified record of one row, read under ``run_id``: any damage raises ChecksumMismatch.

    The checksum covers every column and the run id the row was selected by.
    SQLite keeps whatever type a damaged column was given, so a value of the
    wrong type, or one that breaks the input rules, is damage of the same kind.
    """
    sequence, event_id, event_type, schema_version, payload, checksum = row
    record = JournalRecord(
        run_id=run_id,
        sequence=sequence,
        event_id=event_id,
        event_type=event_type,
        schema_version=schema_version,
        payload=payload,
        checksum=checksum,
    )
    try:
        record.verify()
    except ChecksumMismatch:
        raise
    except ValueError as error:  # InvalidRecord, InvalidIdentifier, LimitExceeded
        raise ChecksumMismatch(
            f"record of run {run_id} sequence {sequence} is damaged ({error}); restore the database "
            "from a backup"
        ) from None
    return record


class SqliteJournal:
    """A ``WorkflowJournal`` on SQLite: one row per record, CAS and fencing in one transaction."""

    def __init__(self, url: str) -> None:
        self._db = _Database(url)

    @property
    def url(self) -> str:
        """The database URL."""
        return self._db.url

    @property
    def durability(self) -> Durability:
        """WAL with synchronous=FULL: acknowledged appends survive a host crash."""
        return Durability.DURABLE

    @property
    def capabilities(self) -> JournalCapabilities:
        """Everything, including expiring leases and fault injection."""
        return JournalCapabilities(
            durability=Durability.DURABLE,
            cross_process=True,
            fencing=True,
            crash_durable=True,
            fault_injection=True,
            snapshots=True,
            lease_expiry=True,
        )

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Compare-and-append an atomic batch under the run's current fencing token."""
        batch = validate_batch(run_id, expected_next, records, fence)
        with self._db.transaction() as connection:
            current = _fence(connection, run_id)
            if (fence is None and current != 0) or (fence is not None and fence != current):
                raise FencingRejected(run_id, 0 if fence is None else fence, current)
            (last,) = connection.execute(
                "SELECT COALESCE(MAX(sequence), 0) FROM mayfly_records WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            actual_next = int(last) + 1
            # The stored rows the batch names, by event id or by sequence, read whole and verified:
            # an exact re-append must equal records that are intact, not just their checksums.
            wanted = {record.event_id for record in batch}
            stored = {
                found.event_id: found
                for found in (
                    _record(run_id, row)
                    for row in connection.execute(
                        f"SELECT {_COLUMNS} FROM mayfly_records WHERE run_id = ? AND (sequence "
                        f"BETWEEN ? AND ? OR event_id IN ({','.join('?' * len(batch))}))",
                        (run_id, batch[0].sequence, batch[-1].sequence, *wanted),
                    )
                )
                if found.event_id in wanted
            }
            replay = all(stored.get(record.event_id) == record for record in batch)
            if expected_next != actual_next and replay:
                return AppendResult(
                    run_id=run_id,
                    last_sequence=batch[-1].sequence,
                    records=batch,
                    already_committed=True,
                )
            for record in batch:
                if record.event_id in stored and stored[record.event_id] != record:
                    raise ConflictingRecord(
                        f"append rejected: run {run_id} event id {record.event_id} is already "
                        f"committed at sequence {stored[record.event_id].sequence} with other content"
                    )
            if expected_next != actual_next:
                raise AppendConflict(run_id, expected_next, actual_next)
            if stored:
                raise ConflictingRecord(
                    f"append rejected: run {run_id} event id {next(iter(stored))} is already committed"
                )
            connection.executemany(
                "INSERT INTO mayfly_records VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.run_id,
                        r.sequence,
                        r.event_id,
                        r.event_type,
                        r.schema_version,
                        r.payload,
                        r.checksum,
                    )
                    for r in batch
                ],
            )
        return AppendResult(run_id=run_id, last_sequence=batch[-1].sequence, records=batch)

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Records after ``after`` in order, each verified; a missing sequence raises JournalGap."""
        run, start, count = validate_read(run_id, after, limit)
        with self._db.reading() as connection:
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM mayfly_records WHERE run_id = ? AND sequence > ? "
                "ORDER BY sequence LIMIT ?",
                (run, start, -1 if count is None else count),
            ).fetchall()
        records: list[JournalRecord] = []
        for expected, row in enumerate(rows, start=start + 1):
            if row[0] != expected:  # reported where it is: the first sequence that is not there
                raise JournalGap(
                    f"journal gap in run {run}: expected sequence {expected}, found {row[0]!r}; "
                    "restore the database from a backup"
                )
            records.append(_record(run, row))
        return records

    def next_sequence(self, run_id: str) -> int:
        """The sequence the next append must carry."""
        run = parse_run_id(run_id)
        with self._db.reading() as connection:
            (last,) = connection.execute(
                "SELECT COALESCE(MAX(sequence), 0) FROM mayfly_records WHERE run_id = ?", (run,)
            ).fetchone()
        return int(last) + 1

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Run ids holding records, sorted, after ``after``."""
        start = "" if after is None else parse_run_id(after)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRecord(f"list_runs limit must be a positive int, got {limit!r}")
        with self._db.reading() as connection:
            rows = connection.execute(
                "SELECT DISTINCT run_id FROM mayfly_records WHERE run_id > ? ORDER BY run_id LIMIT ?",
                (start, limit),
            ).fetchall()
        return [row[0] for row in rows]

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Store the run's snapshot, replacing any earlier one in one statement."""
        run = parse_run_id(run_id)
        if not isinstance(snapshot, SnapshotRecord):
            raise InvalidRecord(f"snapshot must be a SnapshotRecord, got {type(snapshot).__name__}")
        snapshot.validate()
        if snapshot.run_id != run or snapshot.checksum != snapshot.expected_checksum():
            raise InvalidRecord(f"snapshot for run {run} names another run or fails its checksum")
        with self._db.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO mayfly_snapshots VALUES (?, ?)",
                (run, msgspec.json.encode(snapshot)),
            )

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """The run's snapshot, ``None`` if absent; ``SnapshotCorrupt`` if unusable."""
        run = parse_run_id(run_id)
        with self._db.reading() as connection:
            row = connection.execute("SELECT body FROM mayfly_snapshots WHERE run_id = ?", (run,)).fetchone()
        if row is None:
            return None
        try:
            snapshot = msgspec.json.decode(bytes(row[0]), type=SnapshotRecord)
        except msgspec.DecodeError as error:
            raise SnapshotCorrupt(run, f"unreadable: {error}") from None
        snapshot.verify()
        if snapshot.run_id != run:
            raise SnapshotCorrupt(run, f"row holds the snapshot of run {snapshot.run_id}")
        return snapshot

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

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def __enter__(self) -> Self:
        """Return the journal."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the journal."""
        self.close()


def _now_ms() -> int:
    # Wall-clock milliseconds: leases are compared across processes on one host.
    return time.time_ns() // 1_000_000


class SqliteLeaseGuard:
    """A granted SQLite lease; valid until released, or expired and taken over."""

    def __init__(self, store: SqliteLeaseStore, run_id: str, owner: str, token: int, ttl_ms: int) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._token = token
        self._ttl_ms = ttl_ms
        self._released = False

    @property
    def run_id(self) -> str:
        """The leased run."""
        return self._run_id

    @property
    def owner(self) -> str:
        """The owner description."""
        return self._owner

    @property
    def fencing_token(self) -> int:
        """This grant's fencing token."""
        return self._token

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease, or raise LeaseLost if it was released or taken over."""
        ttl = self._ttl_ms if ttl_ms is None else validate_acquire(self._run_id, self._owner, ttl_ms)[2]
        with self._store._db.transaction() as connection:
            row = connection.execute(
                "SELECT token FROM mayfly_leases WHERE run_id = ?", (self._run_id,)
            ).fetchone()
            if self._released or row is None or int(row[0]) != self._token:
                raise LeaseLost(
                    f"recovery lease of run {self._run_id} (token {self._token}) was released or "
                    "taken over; acquire it again"
                )
            connection.execute(
                "UPDATE mayfly_leases SET expires_ms = ? WHERE run_id = ?",
                (_now_ms() + ttl, self._run_id),
            )

    def release(self) -> None:
        """Give the lease up (idempotent); a taken-over lease is left to its new owner."""
        if self._released:
            return
        self._released = True
        with self._store._db.transaction() as connection:
            connection.execute(
                "DELETE FROM mayfly_leases WHERE run_id = ? AND token = ?",
                (self._run_id, self._token),
            )

    def __enter__(self) -> Self:
        """Return the guard."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


class SqliteLeaseStore:
    """A ``RecoveryLeaseStore`` on SQLite: expiring leases, a persistent fencing counter."""

    def __init__(self, url: str) -> None:
        self._db = _Database(url)

    @property
    def url(self) -> str:
        """The database URL."""
        return self._db.url

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> SqliteLeaseGuard:
        """Grant the lease if it is free or expired, with the next fencing token; else LeaseHeld."""
        run, owner, ttl = validate_acquire(run_id, owner, ttl_ms)
        with self._db.transaction() as connection:
            now = _now_ms()
            row = connection.execute(
                "SELECT owner, expires_ms FROM mayfly_leases WHERE run_id = ?", (run,)
            ).fetchone()
            if row is not None and int(row[1]) > now:
                raise LeaseHeld(run, str(row[0]))
            token = _fence(connection, run) + 1
            connection.execute("INSERT OR REPLACE INTO mayfly_fences VALUES (?, ?)", (run, token))
            connection.execute(
                "INSERT OR REPLACE INTO mayfly_leases VALUES (?, ?, ?, ?)",
                (run, owner, token, now + ttl),
            )
        return SqliteLeaseGuard(self, run, owner, token, ttl)

    def current_fence(self, run_id: str) -> int:
        """The newest token granted for the run."""
        run = parse_run_id(run_id)
        with self._db.reading() as connection:
            return _fence(connection, run)

    def close(self) -> None:
        """Close the database connection (leases expire on their own)."""
        self._db.close()

    def __enter__(self) -> Self:
        """Return the store."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        self.close()


def _describe(url: str) -> str:
    """One line for ``mayfly backends``."""
    return "SQLite journal and expiring leases (WAL, synchronous=FULL: durable)"


@hookimpl
def mayfly_journal_backends() -> Sequence[BackendDescriptor]:
    """Offer the SQLite journal for ``sqlite://`` URLs."""
    return [BackendDescriptor(("sqlite",), DISTRIBUTION, SqliteJournal, _describe)]


@hookimpl
def mayfly_lease_backends() -> Sequence[BackendDescriptor]:
    """Offer SQLite recovery leases for ``sqlite://`` URLs."""
    return [BackendDescriptor(("sqlite",), DISTRIBUTION, SqliteLeaseStore, _describe)]
