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
makes corrects it (or, when it has nothing to append, the entry it puts). A wake-up is never lost,
and the hot path (a run that stays runnable) costs no extra fsync.

WAL mode lets readers (``claim``, ``next_wake``) run beside a writer; every
statement is short, so the calls run inline on the hub.

Queue flow control (:mod:`mayfly.queues`) lives here too:

* ``queues``: each queue's settings, as JSON;
* ``runs.dedup_id``, with a partial unique index on ``(queue, dedup_id)``
  over live entries: the candidate entry written before a creating append's
  frames is refused by SQLite itself when a live run holds the id, in any
  process, before a frame is written;
* ``runs.started_ms``: a run's first claim, kept by every later write;
* ``claimed``: the runs claimed from each queue with settings. A local lease
  is an OS lock that dies with its process, so a count of runs in progress
  probes each recorded holder's lock and forgets those that are gone.

An index file of schema version 1 (before queues) is upgraded in place.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import msgspec

from mayfly.model.errors import CorruptionError, DuplicateRun, JournalUnavailable
from mayfly.queues import QueueSettings
from mayfly.runindex import IndexEntry, IndexStatus, more_claimable

__all__ = ["LocalRunIndex"]

INDEX_FILE: Final = "index.sqlite3"
_SCHEMA_VERSION: Final = 2
_REMEMBERED: Final = 4096  # runs whose last written entry is kept in memory
_FLUSH_AFTER_S: Final = 0.05
_OPEN_TIMEOUT_S: Final = 30.0
_COLUMNS: Final = "run_id, queue, status, ready_at, sequence, wake, parent, priority, dedup_id, started_ms"
_PLACES: Final = ", ".join("?" for _ in _COLUMNS.split(", "))
_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    queue      TEXT NOT NULL,
    status     TEXT NOT NULL,
    ready_at   INTEGER,
    sequence   INTEGER NOT NULL,
    wake       INTEGER NOT NULL DEFAULT 0,
    parent     TEXT,
    priority   INTEGER NOT NULL DEFAULT 0,
    dedup_id   TEXT,
    started_ms INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_claim ON runs (status, ready_at) WHERE parent IS NULL;
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{_SCHEMA_VERSION}');
"""
# Version 2 (queue flow control); an index of version 1 gets the columns first (see _prepare).
_QUEUE_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, settings TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS claimed (queue TEXT NOT NULL, run_id TEXT NOT NULL, PRIMARY KEY (queue, run_id))
    WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS runs_dedup ON runs (queue, dedup_id)
    WHERE dedup_id IS NOT NULL AND status != 'terminal';
CREATE INDEX IF NOT EXISTS runs_started ON runs (queue, started_ms) WHERE started_ms IS NOT NULL;
"""
# Insert, or replace a stored entry unless it reflects a later sequence; a stored wake and start are kept.
_UPDATE: Final = """
    queue = excluded.queue, status = excluded.status, ready_at = excluded.ready_at,
    sequence = excluded.sequence, wake = max(runs.wake, excluded.wake),
    parent = excluded.parent, priority = excluded.priority, dedup_id = excluded.dedup_id,
    started_ms = coalesce(runs.started_ms, excluded.started_ms)
"""
_UPSERT: Final = f"""
INSERT INTO runs ({_COLUMNS}) VALUES ({_PLACES})
ON CONFLICT (run_id) DO UPDATE SET {_UPDATE}
WHERE excluded.sequence >= runs.sequence
"""
_CLAIMABLE: Final = """
SELECT {columns} FROM runs
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
        entry.dedup_id,
        entry.started_ms,
    )


def _entry(row: tuple[object, ...]) -> IndexEntry:
    run_id, queue, status, ready_at, sequence, wake, parent, priority, dedup_id, started_ms = row
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
            dedup_id=None if dedup_id is None else str(dedup_id),
            started_ms=None if started_ms is None else int(started_ms),  # type: ignore[call-overload]
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(
            f"run index row of run {run_id!r} is unreadable ({exc}); rebuild the index"
        ) from None


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for a lock another connection holds (worth another try)."""
    return exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _statements(script: str) -> list[str]:
    return [part.strip() for part in script.split(";") if part.strip()]


def _prepare(db: sqlite3.Connection) -> str:
    """WAL mode, then the schema created, or a version-1 index upgraded, in one write transaction.

    Upgrading a version-1 index to version 2 happens once, in whichever
    process comes first; the others find version 2 when their turn comes.
    """
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _statements(_SCHEMA):
            db.execute(statement)
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version == "1":
            columns = {str(row[1]) for row in db.execute("PRAGMA table_info(runs)")}
            for column, kind in (("dedup_id", "TEXT"), ("started_ms", "INTEGER")):
                if column not in columns:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
            version = str(_SCHEMA_VERSION)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
        if version == str(_SCHEMA_VERSION):
            for statement in _statements(_QUEUE_SCHEMA):
                db.execute(statement)
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return str(version)


class LocalRunIndex:
    """The run index of one ``file://`` store, safe across threads and processes."""

    def __init__(self, root: Path, *, durable: bool) -> None:
        self._path = root / INDEX_FILE
        self._durable = durable
        self._lock = threading.Lock()
        self._written: dict[str, IndexEntry] = {}
        self._dirty: dict[str, IndexEntry] = {}
        self._flushed_at = time.monotonic()
        version = self._open()
        if version != str(_SCHEMA_VERSION):
            raise CorruptionError(
                f"run index {self._path} has schema version {version}, this Mayfly reads "
                f"{_SCHEMA_VERSION}; rebuild it with `mayfly index rebuild`"
            )

    def _open(self) -> str:
        """Connect, and create or upgrade the schema in one write transaction; the schema version found.

        SQLite waits out a lock another process holds (``timeout``), but some
        busy answers come back at once, without waiting: a write that would
        start from a stale WAL snapshot, a journal-mode switch racing another
        opener. Opening is retried on those until the same deadline: a worker
        starting beside busy ones must not die of a lock that clears a
        millisecond later.
        """
        deadline = time.monotonic() + _OPEN_TIMEOUT_S
        pause = 0.005
        while True:
            try:
                db = sqlite3.connect(
                    self._path, timeout=_OPEN_TIMEOUT_S, isolation_level=None, check_same_thread=False
                )
            except sqlite3.DatabaseError as exc:
                raise JournalUnavailable(f"cannot open the run index {self._path}: {exc}") from None
            try:
                version = _prepare(db)
            except sqlite3.OperationalError as exc:
                db.close()
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise JournalUnavailable(f"cannot open the run index {self._path}: {exc}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            except sqlite3.DatabaseError as exc:
                db.close()
                raise JournalUnavailable(f"cannot open the run index {self._path}: {exc}") from None
            self._db = db
            return version

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
        wrote = duplicate = False
        with self._transaction(synced=self._durable) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (entry.run_id,)).fetchone()
            if more_claimable(entry, None if row is None else _entry(row)):
                try:
                    db.execute(_UPSERT, _row(entry))
                except sqlite3.IntegrityError:
                    # Only the live-dedup index can refuse it: a live run of the queue holds the id.
                    duplicate = True
                else:
                    wrote = True
        if duplicate:
            assert entry.dedup_id is not None
            raise DuplicateRun(entry.run_id, entry.queue, entry.dedup_id, self.dedup_holder(entry))
        self._remember(entry)
        return wrote

    def before_append_many(self, entries: Sequence[IndexEntry]) -> list[DuplicateRun | None]:
        """:meth:`before_append` for the entries of one group flush, in one transaction (one sync).

        Each entry is decided on its own: one whose queue's dedup id a live
        run holds gets its ``DuplicateRun`` in its slot (and its batch is not
        written), and the others are stored. The entries name distinct runs.
        """
        outcomes: list[DuplicateRun | None] = [None] * len(entries)
        todo = [
            (i, entry)
            for i, entry in enumerate(entries)
            if (known := self._written.get(entry.run_id)) is None or more_claimable(entry, known)
        ]
        if not todo:
            return outcomes
        refused: list[int] = []
        with self._transaction(synced=self._durable) as db:
            for i, entry in todo:
                row = db.execute(f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (entry.run_id,)).fetchone()
                if more_claimable(entry, None if row is None else _entry(row)):
                    try:
                        db.execute(_UPSERT, _row(entry))
                    except sqlite3.IntegrityError:
                        refused.append(i)  # a statement's failure leaves the transaction open
        for i in refused:
            entry = entries[i]
            assert entry.dedup_id is not None
            outcomes[i] = DuplicateRun(entry.run_id, entry.queue, entry.dedup_id, self.dedup_holder(entry))
        for i, entry in todo:
            if outcomes[i] is None:
                self._remember(entry)
        return outcomes

    def dedup_holder(self, entry: IndexEntry) -> str | None:
        """The live run other than ``entry``'s that holds its queue's dedup id, if any."""
        rows = self._query(
            "SELECT run_id FROM runs WHERE queue = ? AND dedup_id = ? AND status != 'terminal' "
            "AND run_id != ?",
            (entry.queue, entry.dedup_id, entry.run_id),
        )
        return str(rows[0][0]) if rows else None

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
                rows = [_row(entry) for entry in (*pending, *entries)]
                try:
                    db.executemany(_UPSERT, rows)
                except sqlite3.IntegrityError:
                    # Two live runs of a queue with one dedup id (appended without the index, then
                    # rebuilt): the first keeps the id, the others are stored without it.
                    for row in rows:
                        try:
                            db.execute(_UPSERT, row)
                        except sqlite3.IntegrityError:
                            db.execute(_UPSERT, (*row[:8], None, row[9]))
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
            db.execute("DELETE FROM claimed WHERE run_id = ?", (run_id,))

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
                f"INSERT INTO runs ({_COLUMNS}) VALUES ({_PLACES}) "
                f"ON CONFLICT (run_id) DO UPDATE SET {_UPDATE}",
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

    def claimed(self, run_id: str, now_ms: int, queue: str | None = None) -> None:
        """A claim took the run: its wake request is answered, a first claim is its start.

        ``queue``: the run's queue has settings, so the claim is recorded for
        its count of runs in progress (:meth:`claimed_runs`).
        """
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET wake = 0, started_ms = coalesce(started_ms, "
                "CASE WHEN status = 'new' THEN ? END) WHERE run_id = ?",
                (now_ms, run_id),
            )
            if queue is not None:
                db.execute("INSERT OR IGNORE INTO claimed (queue, run_id) VALUES (?, ?)", (queue, run_id))

    def candidates(self, *, now_ms: int, queues: Sequence[str] | None, limit: int, offset: int) -> list[str]:
        """Run ids claimable at ``now_ms`` by their entries (their leases are not checked), in claim order."""
        return [str(row[0]) for row in self._claimable("run_id", now_ms, queues, limit, offset)]

    def candidate_entries(
        self, *, now_ms: int, queues: Sequence[str] | None, limit: int, offset: int, exclude: Sequence[str]
    ) -> list[IndexEntry]:
        """The entries :meth:`candidates` names, in claim order, but none of the queues in ``exclude``."""
        rows = self._claimable(_COLUMNS, now_ms, queues, limit, offset, exclude)
        return [_entry(row) for row in rows]

    def _claimable(  # noqa: PLR0917 - internal
        self,
        columns: str,
        now_ms: int,
        queues: Sequence[str] | None,
        limit: int,
        offset: int,
        exclude: Sequence[str] = (),
    ) -> list[tuple[object, ...]]:
        self.flush()
        where = "" if queues is None else f"AND queue IN ({', '.join('?' for _ in queues)})"
        if exclude:
            where += f" AND queue NOT IN ({', '.join('?' for _ in exclude)})"
        params: list[object] = [now_ms, *(queues or ()), *exclude, limit, offset]
        return self._query(_CLAIMABLE.format(columns=columns, queues=where), params)

    # -- queue flow control (mayfly.queues) ------------------------------------------------

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings durably (replacing any), and record its runs that may be in progress.

        Runs claimed while the queue had no settings were not recorded: every
        live root run of the queue that was ever claimed is recorded now, and
        the first count forgets those whose lease is gone.
        """
        encoded = msgspec.json.encode(settings).decode()
        with self._transaction(synced=self._durable) as db:
            db.execute(
                "INSERT INTO queues (name, settings) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET settings = excluded.settings",
                (settings.name, encoded),
            )
            db.execute(
                "INSERT OR IGNORE INTO claimed (queue, run_id) SELECT queue, run_id FROM runs "
                "WHERE queue = ? AND parent IS NULL AND status != 'terminal' "
                "AND (started_ms IS NOT NULL OR status != 'new')",
                (settings.name,),
            )

    def queue_remove(self, name: str) -> bool:
        """Forget the queue's settings; ``False`` if it had none."""
        with self._transaction(synced=self._durable) as db:
            removed = db.execute("DELETE FROM queues WHERE name = ?", (name,)).rowcount > 0
            db.execute("DELETE FROM claimed WHERE queue = ?", (name,))
            return removed

    def queue_settings(self, names: Sequence[str] | None = None) -> dict[str, QueueSettings]:
        """The settings of the queues named (``None``: every queue), by name."""
        if names is None:
            rows = self._query("SELECT name, settings FROM queues ORDER BY name", ())
        else:
            rows = self._query(
                f"SELECT name, settings FROM queues WHERE name IN ({', '.join('?' for _ in names)}) "
                "ORDER BY name",
                tuple(names),
            )
        found: dict[str, QueueSettings] = {}
        for name, value in rows:
            try:
                found[str(name)] = msgspec.json.decode(str(value), type=QueueSettings)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise CorruptionError(
                    f"run index {self._path}: settings of queue {name!r} are unreadable ({exc}); "
                    f"set them again with `mayfly queue set {name}`"
                ) from None
        return found

    def claimed_runs(self, queue: str) -> list[tuple[str, bool]]:
        """The runs recorded as claimed from ``queue``, each with whether its entry is a live root."""
        self.flush()
        rows = self._query(
            "SELECT c.run_id, r.status IS NOT NULL AND r.status != 'terminal' AND r.parent IS NULL "
            "FROM claimed c LEFT JOIN runs r ON r.run_id = c.run_id WHERE c.queue = ?",
            (queue,),
        )
        return [(str(run_id), bool(live)) for run_id, live in rows]

    def forget_claims(self, queue: str, runs: Sequence[str]) -> None:
        """Forget that ``runs`` were claimed from ``queue`` (they ended, or their leases are gone)."""
        with self._transaction() as db:
            db.executemany(
                "DELETE FROM claimed WHERE queue = ? AND run_id = ?", [(queue, run) for run in runs]
            )

    def recent_starts(self, queue: str, since_ms: int) -> int:
        """How many root runs of ``queue`` started after ``since_ms``."""
        self.flush()
        rows = self._query(
            "SELECT count(*) FROM runs WHERE queue = ? AND started_ms > ? AND parent IS NULL",
            (queue, since_ms),
        )
        return int(rows[0][0])  # type: ignore[call-overload, no-any-return]

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
