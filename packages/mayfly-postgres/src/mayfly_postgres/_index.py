"""The run index on PostgreSQL: a ``run_index`` row per run, one-statement claims, LISTEN/NOTIFY wake-ups.

The entry (:mod:`mayfly.runindex`) is written in the transaction of the
append that changes it, so a committed batch and its entry are one fact. A
claim is one statement: it picks claimable root runs in claim order with
``FOR UPDATE SKIP LOCKED`` (two claimants never pick the same row), keeps
only those whose lease is absent, released or expired on the server's clock,
grants each lease with the next fencing token (the same upsert as the lease
store's ``acquire``, re-checked under the lease row's lock), copies the
token into ``runs.fence`` and clears ``wake``. Being one statement, a claim
cut by a server crash has granted nothing or everything it returned.

Wake-ups are ``NOTIFY`` on a channel named for the schema: sent inside the
transaction that makes a run claimable at once (an append without a lease, a
wake, a put of a claimable entry), so a listener is told only after the
commit, and by :meth:`~mayfly.runindex.RunWakeups.notify_wakeups` (a released
lease). Each listening worker holds one dedicated connection that ``LISTEN``s.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any, Final, final

import psycopg
from psycopg import sql

from mayfly.errors import CorruptionError, InvalidRecord, JournalUnavailable
from mayfly.ids import QUEUE_NAME, parse_run_id
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly.substrate import offload
from mayfly_postgres._pool import first_line, in_hub_task, pause, unavailable
from mayfly_postgres._store import Store
from mayfly_postgres._url import PostgresSettings

__all__ = ["IndexStatements", "PostgresWakeupListener", "check_entries", "claimable_now", "wakeup_channel"]

_INT64: Final = 1 << 63
_COLUMNS: Final = "run_id::text, queue, status, ready_at, sequence, wake, parent::text, priority"
_CLAIMABLE: Final = (
    "i.parent IS NULL AND (i.status IN ('new', 'running') "
    "OR (i.status = 'waiting' AND (i.ready_at <= %(now)s::bigint OR i.wake)))"
    # The index predicate of run_index_claim, implied by the line above, spelt out for the planner.
    " AND (i.status IN ('new', 'running') OR (i.status = 'waiting' AND (i.ready_at IS NOT NULL OR i.wake)))"
)
_QUEUES: Final = "(%(queues)s::text[] IS NULL OR i.queue = ANY(%(queues)s::text[]))"


def wakeup_channel(schema: str) -> str:
    """The NOTIFY channel of a schema's wake-ups (at most 63 bytes, PostgreSQL's identifier limit)."""
    name = f"mayfly_wakeups_{schema}"
    if len(name) <= 63:
        return name
    return f"mayfly_wakeups_{hashlib.sha256(schema.encode()).hexdigest()[:40]}"


def claimable_now(entry: IndexEntry, now_ms: int) -> bool:
    """Whether the entry alone makes its run claimable at ``now_ms`` (leases aside)."""
    if entry.parent is not None:
        return False
    if entry.status in (IndexStatus.NEW, IndexStatus.RUNNING):
        return True
    return entry.status is IndexStatus.WAITING and (
        entry.wake or (entry.ready_at_ms is not None and entry.ready_at_ms <= now_ms)
    )


def _int64(what: str, run_id: str, value: int | None) -> None:
    if value is not None and not -_INT64 <= value < _INT64:
        raise InvalidRecord(f"index entry of run {run_id}: {what} {value} does not fit in 64 bits")


def check_entries(entries: object) -> list[IndexEntry]:
    """Validate ``index_put``'s entries; fold repeats of a run as one-by-one puts would (InvalidRecord)."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise InvalidRecord(f"index entries must be a sequence of IndexEntry, got {type(entries).__name__}")
    folded: dict[str, IndexEntry] = {}
    for entry in entries:
        if not isinstance(entry, IndexEntry):
            raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
        run = parse_run_id(entry.run_id)
        if entry.parent is not None:
            parse_run_id(entry.parent)
        if not isinstance(entry.queue, str) or QUEUE_NAME.fullmatch(entry.queue) is None:
            raise InvalidRecord(
                f"index entry of run {run}: queue {entry.queue!r:.80} must match {QUEUE_NAME.pattern}"
            )
        if not isinstance(entry.status, IndexStatus):
            raise InvalidRecord(
                f"index entry of run {run}: status {entry.status!r:.40} is not an IndexStatus"
            )
        if entry.sequence < 0:
            raise InvalidRecord(f"index entry of run {run}: sequence {entry.sequence} is negative")
        for what, value in (
            ("sequence", entry.sequence),
            ("ready_at_ms", entry.ready_at_ms),
            ("priority", entry.priority),
        ):
            _int64(what, run, value)
        known = folded.get(run)
        if known is None:
            folded[run] = entry
        elif entry.sequence >= known.sequence:
            # A later put replaces an earlier one of no higher sequence and keeps its wake.
            folded[run] = entry if entry.wake or not known.wake else _woken(entry)
    return list(folded.values())


def _woken(entry: IndexEntry) -> IndexEntry:
    return IndexEntry(
        run_id=entry.run_id,
        queue=entry.queue,
        status=entry.status,
        ready_at_ms=entry.ready_at_ms,
        sequence=entry.sequence,
        wake=True,
        parent=entry.parent,
        priority=entry.priority,
    )


def entry_parameters(entry: IndexEntry) -> dict[str, Any]:
    """The one-entry upsert's parameters (scalars: cheaper to send than one-element arrays)."""
    return {
        "run": entry.run_id,
        "queue": entry.queue,
        "status": entry.status.value,
        "ready": entry.ready_at_ms,
        "sequence": entry.sequence,
        "wake": entry.wake,
        "parent": entry.parent,
        "priority": entry.priority,
    }


def batch_parameters(entries: Sequence[IndexEntry]) -> dict[str, Any]:
    """The upsert's parameters for many entries (one per run)."""
    return {
        "runs": [e.run_id for e in entries],
        "queues": [e.queue for e in entries],
        "statuses": [e.status.value for e in entries],
        "ready": [e.ready_at_ms for e in entries],
        "sequences": [e.sequence for e in entries],
        "wakes": [e.wake for e in entries],
        "parents": [e.parent for e in entries],
        "priorities": [e.priority for e in entries],
    }


def row_entry(row: Sequence[Any]) -> IndexEntry:
    """The entry one ``run_index`` row holds."""
    run_id, queue, status, ready_at, sequence, wake, parent, priority = row
    try:
        return IndexEntry(
            run_id=str(run_id),
            queue=str(queue),
            status=IndexStatus(str(status)),
            ready_at_ms=None if ready_at is None else int(ready_at),
            sequence=int(sequence),
            wake=bool(wake),
            parent=None if parent is None else str(parent),
            priority=int(priority),
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(
            f"run index row of run {run_id!r} is unreadable ({exc}); rebuild it with `mayfly index rebuild`"
        ) from None


class IndexStatements:
    """The run index SQL of one schema."""

    def __init__(self, store: Store) -> None:
        index, leases, runs = store.table("run_index"), store.table("leases"), store.table("runs")
        self.channel = wakeup_channel(store.settings.schema)
        channel = sql.Literal(self.channel)
        # Insert, or replace a stored entry unless it reflects a later sequence; a stored wake is kept.
        insert = (
            "INSERT INTO {index} AS i (run_id, queue, status, ready_at, sequence, wake, parent, priority) "
        )
        conflict = (
            " ON CONFLICT (run_id) DO UPDATE SET queue = EXCLUDED.queue, status = EXCLUDED.status, "
            "ready_at = EXCLUDED.ready_at, sequence = EXCLUDED.sequence, wake = i.wake OR EXCLUDED.wake, "
            "parent = EXCLUDED.parent, priority = EXCLUDED.priority WHERE EXCLUDED.sequence >= i.sequence"
        )
        many = sql.SQL(
            insert + "SELECT * FROM unnest(%(runs)s::uuid[], %(queues)s::text[], %(statuses)s::text[], "
            "%(ready)s::bigint[], %(sequences)s::bigint[], %(wakes)s::boolean[], %(parents)s::uuid[], "
            "%(priorities)s::bigint[])" + conflict
        ).format(index=index)
        one = sql.SQL(
            insert + "VALUES (%(run)s::uuid, %(queue)s::text, %(status)s::text, %(ready)s::bigint, "
            "%(sequence)s::bigint, %(wake)s::boolean, %(parent)s::uuid, %(priority)s::bigint)" + conflict
        ).format(index=index)
        notify = "WITH put AS ({upsert}) SELECT pg_notify({channel}, '')"
        self.put, self.put_one = many, one
        self.put_notify = sql.SQL(notify).format(upsert=many, channel=channel)
        self.put_one_notify = sql.SQL(notify).format(upsert=one, channel=channel)
        self.get = sql.SQL("SELECT " + _COLUMNS + " FROM {index} WHERE run_id = %s::uuid").format(index=index)
        self.next_wake = sql.SQL(
            "SELECT min(i.ready_at) FROM {index} i WHERE i.parent IS NULL AND i.status = 'waiting' "
            "AND i.ready_at > %(now)s::bigint AND " + _QUEUES
        ).format(index=index)
        # A wake makes a waiting root run claimable now unless it is leased: tell the listeners then.
        self.wake = sql.SQL(
            "WITH woken AS (UPDATE {index} SET wake = true WHERE run_id = %s::uuid AND status <> 'terminal' "
            "RETURNING run_id, parent), "
            "told AS (SELECT pg_notify({channel}, '') FROM woken w WHERE w.parent IS NULL AND NOT EXISTS "
            "(SELECT FROM {leases} l WHERE l.run_id = w.run_id AND l.expires_at > clock_timestamp())) "
            "SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM told)"
        ).format(index=index, leases=leases, channel=channel)
        # The claim (see the module doc). The lease upsert is the lease store's acquire, row by row:
        # a lease granted after this statement's snapshot is seen by its WHERE, under the row lock.
        self.claim = sql.SQL(
            "WITH picked AS (SELECT i.run_id, i.priority, i.ready_at FROM {index} i WHERE "
            + _CLAIMABLE
            + " AND "
            + _QUEUES
            + " "
            "AND NOT EXISTS (SELECT FROM {leases} l WHERE l.run_id = i.run_id "
            "AND l.expires_at > clock_timestamp()) "
            "ORDER BY i.priority DESC, i.ready_at NULLS LAST, i.run_id LIMIT %(limit)s::bigint "
            "FOR UPDATE OF i SKIP LOCKED), "
            "granted AS (INSERT INTO {leases} AS l (run_id, owner, token, grant_id, expires_at) "
            "SELECT run_id, %(owner)s::text, 1, gen_random_uuid(), "
            "clock_timestamp() + %(ttl)s::float8 * interval '1 millisecond' FROM picked "
            "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1, "
            "grant_id = EXCLUDED.grant_id, expires_at = EXCLUDED.expires_at "
            "WHERE l.expires_at <= clock_timestamp() RETURNING l.run_id, l.token, l.grant_id), "
            "fenced AS (INSERT INTO {runs} AS r (run_id, fence) SELECT run_id, token FROM granted "
            "ON CONFLICT (run_id) DO UPDATE SET fence = GREATEST(r.fence, EXCLUDED.fence) RETURNING 1), "
            "answered AS (UPDATE {index} i SET wake = false "
            "WHERE i.wake AND i.run_id IN (SELECT run_id FROM granted) RETURNING 1) "
            "SELECT g.run_id::text, g.token, g.grant_id::text FROM granted g JOIN picked p USING (run_id) "
            "ORDER BY p.priority DESC, p.ready_at NULLS LAST, g.run_id"
        ).format(index=index, leases=leases, runs=runs)
        self.notify = sql.SQL("SELECT pg_notify({channel}, '')").format(channel=channel)


def _listen(settings: PostgresSettings, channel: str) -> psycopg.Connection[Any]:
    connection: psycopg.Connection[Any] = psycopg.Connection.connect(
        settings.conninfo, autocommit=True, options=settings.startup_options
    )
    try:
        connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except BaseException:
        connection.close()
        raise
    return connection


@final
class PostgresWakeupListener:
    """One worker's ``LISTEN`` connection: readable when some run became claimable now.

    Wake-ups only save latency (a worker that misses one finds the run at its
    next poll), so a lost connection is replaced in :meth:`drain`, which
    returns once listening again (the caller then looks for runs, covering
    what was missed); in a hub task it retries until the server is back.
    """

    def __init__(self, settings: PostgresSettings, channel: str) -> None:
        self._settings = settings
        self._channel = channel
        self._closed = False
        self._connection = self._open(deadline=time.monotonic() + settings.reconnect_timeout)

    def _open(self, *, deadline: float | None) -> psycopg.Connection[Any]:
        delay = 0.05
        while True:
            try:
                if in_hub_task():
                    return offload(_listen, self._settings, self._channel)
                return _listen(self._settings, self._channel)
            except psycopg.Error as error:
                if self._closed or (deadline is not None and time.monotonic() + delay > deadline):
                    raise unavailable(self._settings.url, "listening for wake-ups", error) from None
            pause(delay)
            delay = min(delay * 2, 1.0)

    def fileno(self) -> int:
        """The listening connection's socket."""
        return self._connection.pgconn.socket

    def drain(self) -> None:
        """Consume the pending notifications; replace the connection if it was lost."""
        if self._closed:
            return
        pgconn = self._connection.pgconn
        try:
            pgconn.consume_input()
            while pgconn.notifies() is not None:
                pass
            if pgconn.status == psycopg.pq.ConnStatus.OK:
                return
            problem = "the connection is broken"
        except psycopg.Error as error:
            problem = first_line(error)
        self._connection.close()
        try:
            # In a worker's hub: as long as the outage lasts. Elsewhere: the URL's reconnect_timeout.
            deadline = None if in_hub_task() else time.monotonic() + self._settings.reconnect_timeout
            self._connection = self._open(deadline=deadline)
        except JournalUnavailable as exc:
            raise JournalUnavailable(f"{exc} (the listening connection was lost: {problem})") from None

    def close(self) -> None:
        """Stop listening and close the connection."""
        self._closed = True
        self._connection.close()
