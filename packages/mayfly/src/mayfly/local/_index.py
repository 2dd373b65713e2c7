"""The local store's run index: one SQLite table beside the run files (``DIR/index.sqlite3``).

SQLite is in the standard library, takes cross-process locks on its own, and
answers "the next claimable runs in wake order" with one indexed query, which
a directory of files cannot. The index is derived data (see
:mod:`mayfly.runindex`): a run file and an index row cannot be written
atomically together, so the journal uses one write order under the run's
exclusive ``flock``:

1. before the frames, the new entry is written if it is *more claimable* than
   the stored one (:func:`~mayfly.runindex.more_claimable`), durably
   (``synchronous=FULL``) when the journal is durable;
2. after the frames, the exact entry, without a sync of its own.

A crash between the frames and step 2 leaves an entry at least as claimable
as the truth: a worker claims the run, finds less to do, and the append it
makes (or the parked entry it puts) corrects it. A wake-up is never lost,
and the hot path (a run that stays runnable) costs no extra fsync.

WAL mode lets readers (``claim``, ``next_wake``) run beside a writer; every
statement is short, so the calls run inline on the hub.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from mayfly.model.errors import CorruptionError, JournalUnavailable
from mayfly.runindex import IndexEntry, IndexStatus, more_claimable

__all__ = ["LocalRunIndex"]

INDEX_FILE: Final = "index.sqlite3"
_SCHEMA_VERSION: Final = 1
_REMEMBERED: Final = 4096  # runs whose last written entry is kept in memory
_FLUSH_AFTER_S: Final = 0.05
_COLUMNS: Final = "run_id, queue, status, ready_at, sequence, wake, parent, priority"
_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id   TEXT PRIMARY KEY,
    queue    TEXT NOT NULL,
    status   TEXT NOT NULL,
    ready_at INTEGER,
    sequence INTEGER NOT NULL,
    wake     INTEGER NOT NULL DEFAULT 0,
    parent   TEXT,
    priority INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_claim ON runs (status, ready_at) WHERE parent IS NULL;
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{_SCHEMA_VERSION}');
"""
# Insert, or replace a stored entry unless it reflects a later sequence; a stored wake is kept.
_UPSERT: Final = f"""
INSERT INTO runs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id) DO UPDATE SET
    queue = excluded.queue, status = excluded.status, ready_at = excluded.ready_at,
    sequence = excluded.sequence, wake = max(runs.wake, excluded.wake),
    parent = excluded.parent, priority = excluded.priority
WHERE excluded.sequence >= runs.sequence
"""
_CLAIMABLE: Final = """
SELECT run_id FROM runs
WHERE parent IS NULL
  AND (status IN ('new', 'running') OR (status = 'waiting' AND (ready_at <= ? OR wake = 1)))
  {queues}
ORDER BY priority DESC, ready_at IS NULL, ready_at, run_id
LIMIT ? OFFSET ?
"""


def _row(entry: IndexEntry) -> tuple[object, ...]:
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


def _entry(row: tuple[object, ...]) -> IndexEntry:
    run_id, queue, status, ready_at, sequence, wake, parent, priority = row
    try:
        return IndexEntry(
            run_id=str(run_id),
            queue=str(queue),
            status=IndexStatus(str(status)),
            ready_at_ms=None if ready_at is None else int(ready_at),  # type: ignore[call-overload]
            sequence=int(sequence),  # type: ignore[call-overload]
            wake=bool(wake),
            parent=None if parent is None else str(parent),
            priority=int(priority),  # type: ignore[call-overload]
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(
            f"run index row of run {run_id!r} is unreadable ({exc}); rebuild the index"
        ) from None


class LocalRunIndex:
    """The run index of one ``file://`` store, safe across threads and processes."""

    def __init__(self, root: Path, *, durable: bool) -> None:
        self._path = root / INDEX_FILE
        self._durable = durable
        self._lock = threading.Lock()
        self._written: dict[str, IndexEntry] = {}
        self._dirty: dict[str, IndexEntry] = {}
        self._flushed_at = time.monotonic()
        try:
            self._db = sqlite3.connect(
                self._path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            (version,) = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise JournalUnavailable(f"cannot open the run index {self._path}: {exc}") from None
        if version != str(_SCHEMA_VERSION):
            raise CorruptionError(
                f"run index {self._path} has schema version {version}, this Mayfly reads "
                f"{_SCHEMA_VERSION}; rebuild it with `mayfly index rebuild`"
            )

    @contextmanager
    def _transaction(self, *, synced: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                if synced:
                    self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise JournalUnavailable(f"run index {self._path}: {exc}") from None
            finally:
                if synced:
                    self._db.execute("PRAGMA synchronous=NORMAL")

    def _query(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise JournalUnavailable(f"run index {self._path}: {exc}") from None

    # -- writes around an append (caller holds the run's exclusive flock) -----------------

    def before_append(self, entry: IndexEntry) -> bool:
        """Write ``entry`` now if it makes the run claimable sooner than the stored entry does; say if it did.

        The entry this process last wrote for the run stands in for the stored
        one: while a process appends to a run it holds the run's lease, and no
        one else writes a less claimable entry for it meanwhile (a wake only
        makes it more claimable). So the hot path — a run that stays runnable
        — costs no read and no transaction here.
        """
        known = self._written.get(entry.run_id)
        if known is not None and not more_claimable(entry, known):
            return False
        wrote = False
        with self._transaction(synced=self._durable) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (entry.run_id,)).fetchone()
            if more_claimable(entry, None if row is None else _entry(row)):
                db.execute(_UPSERT, _row(entry))
                wrote = True
        self._remember(entry)
        return wrote

    def after_append(self, entry: IndexEntry) -> None:
        """Record the exact entry the committed batch produced.

        A run that was runnable and stays runnable (most appends) changes only
        its position in the claim order, so that entry is kept in memory and
        written with the next write, read or flush, at most
        ``_FLUSH_AFTER_S`` later: a crash meanwhile leaves a runnable entry
        for a runnable run, which is all a claim needs. Any other change (the
        run starts to wait, or ends) is written at once, so a released run is
        not claimed again for nothing.
        """
        known = self._written.get(entry.run_id)
        runnable = (IndexStatus.NEW, IndexStatus.RUNNING)
        if known is not None and known.status in runnable and entry.status in runnable:
            self._dirty[entry.run_id] = entry
            self._remember(entry)
            if time.monotonic() - self._flushed_at < _FLUSH_AFTER_S:
                return
            entries: list[IndexEntry] = []
        else:
            entries = [entry]
        self.put(entries)

    def flush(self) -> None:
        """Write the entries kept in memory (see :meth:`after_append`)."""
        if self._dirty:
            self.put([])

    def _remember(self, entry: IndexEntry) -> None:
        written = self._written
        if len(written) >= _REMEMBERED and entry.run_id not in written:
            written.pop(next(iter(written)))
        written[entry.run_id] = entry

    # -- the index operations -----------------------------------------------------------

    def put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries; a lower sequence never replaces a stored one, and a stored wake is kept."""
        with self._lock:
            pending = list(self._dirty.values())
            self._dirty.clear()
        try:
            with self._transaction() as db:
                db.executemany(_UPSERT, [_row(entry) for entry in (*pending, *entries)])
        except BaseException:
            with self._lock:
                for entry in pending:
                    self._dirty.setdefault(entry.run_id, entry)
            raise
        self._flushed_at = time.monotonic()
        for entry in entries:
            self._remember(entry)

    def delete(self, run_id: str) -> None:
        """Remove the run's entry (a purge), durably when the journal is durable."""
        with self._lock:
            self._dirty.pop(run_id, None)
            self._written.pop(run_id, None)
        with self._transaction(synced=self._durable) as db:
            db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def replace(self, entry: IndexEntry) -> None:
        """Store ``entry`` whatever the stored sequence (keeping a stored wake); caller holds the run's flock.

        Only for an entry left *ahead of the journal*: written before frames a
        crash then lost (see the module docstring), which the sequence rule
        would otherwise keep forever, making the run claimable on every poll.
        """
        with self._lock:
            self._dirty.pop(entry.run_id, None)
        with self._transaction() as db:
            db.execute(
                f"INSERT INTO runs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET queue = excluded.queue, status = excluded.status, "
                "ready_at = excluded.ready_at, sequence = excluded.sequence, "
                "wake = max(runs.wake, excluded.wake), parent = excluded.parent, "
                "priority = excluded.priority",
                _row(entry),
            )
        self._remember(entry)

    def get(self, run_id: str) -> IndexEntry | None:
        """The run's entry, or ``None``."""
        self.flush()
        rows = self._query(f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return _entry(rows[0]) if rows else None

    def wake(self, run_id: str) -> bool:
        """Set the run's wake flag; ``False`` if it has no entry or has ended."""
        with self._transaction(synced=self._durable) as db:
            cursor = db.execute(
                "UPDATE runs SET wake = 1 WHERE run_id = ? AND status != 'terminal'", (run_id,)
            )
            return cursor.rowcount > 0

    def clear_wake(self, run_id: str) -> None:
        """A claim took the run: its wake request is answered."""
        with self._transaction() as db:
            db.execute("UPDATE runs SET wake = 0 WHERE run_id = ?", (run_id,))

    def candidates(self, *, now_ms: int, queues: Sequence[str] | None, limit: int, offset: int) -> list[str]:
        """Run ids claimable at ``now_ms`` by their entries (their leases are not checked), in claim order."""
        self.flush()
        where = "" if queues is None else f"AND queue IN ({', '.join('?' for _ in queues)})"
        params: list[object] = [now_ms, *(queues or ()), limit, offset]
        return [str(row[0]) for row in self._query(_CLAIMABLE.format(queues=where), params)]

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None) -> int | None:
        """The earliest wake time after ``now_ms`` of a waiting root run."""
        self.flush()
        where = "" if queues is None else f"AND queue IN ({', '.join('?' for _ in queues)})"
        rows = self._query(
            "SELECT min(ready_at) FROM runs WHERE parent IS NULL AND status = 'waiting' "
            f"AND ready_at > ? {where}",
            [now_ms, *(queues or ())],
        )
        value = rows[0][0] if rows else None
        return None if value is None else int(value)  # type: ignore[call-overload]

    def close(self) -> None:
        """Write what is kept in memory and close the database connection."""
        try:
            self.flush()
        finally:
            with self._lock:
                self._db.close()
