"""The run index on PostgreSQL: a ``run_index`` row per run, one-statement claims, LISTEN/NOTIFY wake-ups.

The entry (:mod:`mayfly.runindex`) is written in the transaction of the
append that changes it, so a committed batch and its entry are one fact. A
claim is one statement: it picks claimable root runs in claim order with
``FOR UPDATE SKIP LOCKED`` (two claimants never pick the same row), keeps
only those whose lease is absent, released or expired on the server's clock,
grants each lease with the next fencing token (the same upsert as the lease
store's ``acquire``, re-checked under the lease row's lock), copies the
token into ``runs.fence``, clears ``wake`` and records the start
(``started_ms``) of a run claimed for the first time. Being one statement (a
call of the ``mayfly_claim`` function that migration 3 creates, see
:data:`mayfly_postgres._schema.CLAIM_FUNCTION`), a claim cut by a server
crash has granted nothing or everything it returned.

Queue flow control (:mod:`mayfly.queues`): the same call locks the settings
rows of the limited queues it may take runs from, then, in a fresh snapshot,
counts each one's leased runs and recent starts and takes no more than the
queue's limits allow; claims of queues without limits lock nothing. A
``dedup_id`` is unique per queue among live entries (a partial unique index),
so the append of a second live run with it fails in its transaction.

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

import msgspec
import psycopg
from psycopg import sql

from mayfly.errors import CorruptionError, InvalidRecord, JournalUnavailable
from mayfly.ids import QUEUE_NAME, parse_run_id
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly.substrate import offload
from mayfly_postgres._pool import first_line, in_hub_task, pause, unavailable
from mayfly_postgres._store import Store, rendered
from mayfly_postgres._url import PostgresSettings

__all__ = ["IndexStatements", "PostgresWakeupListener", "check_entries", "claimable_now", "wakeup_channel"]

_INT64: Final = 1 << 63
_COLUMNS: Final = (
    "run_id::text, queue, status, ready_at, sequence, wake, parent::text, priority, dedup_id, started_ms"
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
        if entry.dedup_id is not None and (not isinstance(entry.dedup_id, str) or not entry.dedup_id):
            raise InvalidRecord(
                f"index entry of run {run}: dedup_id {entry.dedup_id!r:.80} must be a non-empty str"
            )
        if entry.sequence < 0:
            raise InvalidRecord(f"index entry of run {run}: sequence {entry.sequence} is negative")
        for what, value in (
            ("sequence", entry.sequence),
            ("ready_at_ms", entry.ready_at_ms),
            ("priority", entry.priority),
            ("started_ms", entry.started_ms),
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
    return msgspec.structs.replace(entry, wake=True)


def entry_parameters(entry: IndexEntry, into: dict[str, Any]) -> None:
    """Add an indexed append's entry to a statement's parameters (``put_appended``'s).

    Scalars, cheaper to send than one-element arrays; the run id is the statement's ``run``.
    """
    into["e_queue"] = entry.queue
    into["e_status"] = entry.status.value
    into["e_ready"] = entry.ready_at_ms
    into["e_sequence"] = entry.sequence
    into["e_wake"] = entry.wake
    into["e_parent"] = entry.parent
    into["e_priority"] = entry.priority
    into["e_dedup"] = entry.dedup_id
    into["e_started"] = entry.started_ms


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
        "dedups": [e.dedup_id for e in entries],
        "starts": [e.started_ms for e in entries],
    }


def row_entry(row: Sequence[Any]) -> IndexEntry:
    """The entry one ``run_index`` row holds."""
    run_id, queue, status, ready_at, sequence, wake, parent, priority, dedup_id, started_ms = row
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
            dedup_id=None if dedup_id is None else str(dedup_id),
            started_ms=None if started_ms is None else int(started_ms),
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(
            f"run index row of run {run_id!r} is unreadable ({exc}); rebuild it with `mayfly index rebuild`"
        ) from None


class IndexStatements:
    """The run index SQL of one schema."""

    def __init__(self, store: Store) -> None:
        index, leases = store.table("run_index"), store.table("leases")
        self.channel = wakeup_channel(store.settings.schema)
        channel = sql.Literal(self.channel)
        # Insert, or replace a stored entry unless it reflects a later sequence; a stored wake is kept.
        insert = (
            "INSERT INTO {index} AS i (run_id, queue, status, ready_at, sequence, wake, parent, priority, "
            "dedup_id, started_ms) "
        )
        conflict = (
            " ON CONFLICT (run_id) DO UPDATE SET queue = EXCLUDED.queue, status = EXCLUDED.status, "
            "ready_at = EXCLUDED.ready_at, sequence = EXCLUDED.sequence, wake = i.wake OR EXCLUDED.wake, "
            "parent = EXCLUDED.parent, priority = EXCLUDED.priority, dedup_id = EXCLUDED.dedup_id, "
            # A recorded start is kept: only a claim records one.
            "started_ms = COALESCE(i.started_ms, EXCLUDED.started_ms) WHERE EXCLUDED.sequence >= i.sequence"
        )
        many = sql.SQL(
            insert + "SELECT * FROM unnest(%(runs)s::uuid[], %(queues)s::text[], %(statuses)s::text[], "
            "%(ready)s::bigint[], %(sequences)s::bigint[], %(wakes)s::boolean[], %(parents)s::uuid[], "
            "%(priorities)s::bigint[], %(dedups)s::text[], %(starts)s::bigint[])" + conflict
        ).format(index=index)
        self.put = many
        self.put_notify = sql.SQL("WITH put AS ({upsert}) SELECT pg_notify({channel}, '')").format(
            upsert=many, channel=channel
        )
        # One entry of an indexed append (mayfly_postgres._journal), parameters named as entry_parameters
        # names them: upserted by CTEs of the append's own statement, only if its CTE ``appended``
        # inserted the batch. ``announce`` tells the listeners then, in the same transaction.
        values = (
            "%(run)s::uuid, %(e_queue)s::text, %(e_status)s::text, %(e_ready)s::bigint, "
            "%(e_sequence)s::bigint, %(e_wake)s::boolean, %(e_parent)s::uuid, %(e_priority)s::bigint, "
            "%(e_dedup)s::text, %(e_started)s::bigint"
        )
        self.put_appended = sql.SQL(
            "put AS (" + insert + "SELECT " + values + " WHERE EXISTS (SELECT FROM appended)" + conflict + ")"
        ).format(index=index)
        self.announce = sql.SQL(
            "told AS (SELECT pg_notify({channel}, '') FROM (SELECT FROM appended LIMIT 1) AS a)"
        ).format(channel=channel)
        self.get = rendered(
            sql.SQL("SELECT " + _COLUMNS + " FROM {index} WHERE run_id = %s::uuid").format(index=index)
        )
        # The first wake time after now: the head of a range of run_index_wake (ready_at > now); with
        # queues named, the range is walked until an entry of one of them.
        self.next_wake = rendered(
            sql.SQL(
                "SELECT min(i.ready_at) FROM {index} i WHERE i.parent IS NULL AND i.status = 'waiting' "
                "AND i.ready_at > %(now)s::bigint AND " + _QUEUES
            ).format(index=index)
        )
        # A wake makes a waiting root run claimable now unless it is leased: tell the listeners then.
        self.wake = sql.SQL(
            "WITH woken AS (UPDATE {index} SET wake = true WHERE run_id = %s::uuid AND status <> 'terminal' "
            "RETURNING run_id, parent), "
            "told AS (SELECT pg_notify({channel}, '') FROM woken w WHERE w.parent IS NULL AND NOT EXISTS "
            "(SELECT FROM {leases} l WHERE l.run_id = w.run_id AND l.expires_at > clock_timestamp())) "
            "SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM told)"
        ).format(index=index, leases=leases, channel=channel)
        # The claim (see the module doc): one call of the migration's function, one statement.
        self.claim = rendered(
            sql.SQL(
                "SELECT claimed_run, claimed_token, claimed_grant FROM {claim}(%(owner)s::text, "
                "%(limit)s::bigint, %(ttl)s::float8, %(now)s::bigint, %(queues)s::text[], "
                "%(held_names)s::text[], %(held_counts)s::bigint[])"
            ).format(claim=store.table("mayfly_claim"))
        )
        queues = store.table("queues")
        self.queue_columns = "name, concurrency, worker_concurrency, rate_limit, rate_period_ms, priority"
        self.queue_set = sql.SQL(
            "INSERT INTO {queues} AS q (" + self.queue_columns + ") VALUES (%(name)s::text, "
            "%(concurrency)s::integer, %(worker_concurrency)s::integer, %(rate_limit)s::integer, "
            "%(rate_period_ms)s::bigint, %(priority)s::boolean) ON CONFLICT (name) DO UPDATE SET "
            "concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency, "
            "rate_limit = EXCLUDED.rate_limit, rate_period_ms = EXCLUDED.rate_period_ms, "
            "priority = EXCLUDED.priority, updated_at = now()"
        ).format(queues=queues)
        self.queue_get = sql.SQL(
            "SELECT " + self.queue_columns + " FROM {queues} WHERE name = %s::text"
        ).format(queues=queues)
        self.queue_list = sql.SQL("SELECT " + self.queue_columns + " FROM {queues} ORDER BY name").format(
            queues=queues
        )
        self.queue_remove = sql.SQL("DELETE FROM {queues} WHERE name = %s::text").format(queues=queues)
        # The facts the claim counts, as it counts them (one snapshot).
        self.queue_usage = sql.SQL(
            "SELECT (SELECT count(*) FROM {index} i JOIN {leases} l ON l.run_id = i.run_id "
            "WHERE i.queue = %(name)s::text AND i.parent IS NULL AND i.status <> 'terminal' "
            "AND l.expires_at > clock_timestamp()), "
            "(SELECT count(*) FROM {index} i JOIN {queues} q ON q.name = i.queue "
            "WHERE i.queue = %(name)s::text AND q.rate_period_ms IS NOT NULL AND i.started_ms IS NOT NULL "
            "AND i.started_ms > %(now)s::bigint - q.rate_period_ms AND i.parent IS NULL)"
        ).format(index=index, leases=leases, queues=queues)
        # The live run holding a dedup id on a queue (read after a refused append rolled back).
        self.dedup_holder = sql.SQL(
            "SELECT run_id::text FROM {index} WHERE queue = %s::text AND dedup_id = %s::text "
            "AND status <> 'terminal' AND run_id <> %s::uuid LIMIT 1"
        ).format(index=index)
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
