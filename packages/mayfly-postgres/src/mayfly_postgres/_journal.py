"""``PostgresJournal``: compare-and-append with the fencing check in one statement, ambiguity resolved.

The happy path of an append is one autocommit statement: a data-modifying CTE
advances ``runs.next_sequence`` only if it equals ``expected_next`` and
``runs.fence`` equals the presented token, and the records are inserted only
if that row moved. The row lock on the run serialises racing writers and lease
grants; under READ COMMITTED the losing statement re-checks the row's newest
version, so a stale fence or a lost race inserts nothing. When nothing was
inserted, one read (one snapshot) classifies why, in the order the contract
gives: fencing, exact re-append, conflicting record, sequence conflict. An
exact re-append is one whose stored rows, read whole and checksum-verified,
equal the batch: a damaged row raises ``ChecksumMismatch``, never "already
committed".

When the connection drops while the statement may have committed, the
journal does not guess: it reads the batch's event ids back on a fresh
connection. All present and identical means committed (success, proven);
none present means not committed, and the append is retried through the same
compare-and-append, which can never write the batch twice.

An indexed append (``append_indexed``) is one statement too: the same
compare-and-append after locking the run's index entry, with the entry (asked
for before the statement is sent: asking changes nothing) upserted by the
same statement only if it inserted the batch, and, for a run claimable at
once without a lease (a creation, a run left for the workers), a ``NOTIFY``
to listening workers: one round trip, one commit.

The append statements go on the wire through libpq directly, prepared once
per session (:mod:`mayfly_postgres._wire`): psycopg's general machinery
around a statement cost several times what the statement's own client work
does. A group commit sends many runs' statements in one such pipeline.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias, final

import psycopg
from psycopg import pq, sql

from mayfly.backend import JournalBase
from mayfly.errors import (
    ConflictingRecord,
    CorruptionError,
    DuplicateRun,
    InvalidRecord,
    JournalUnavailable,
    LeaseHeld,
    SnapshotCorrupt,
)
from mayfly.journal import (
    AppendResult,
    JournalCapabilities,
    JournalRecord,
    Relay,
    RunSummary,
    SnapshotRecord,
    WorkflowJournal,
)
from mayfly.lease import RecoveryLeaseGuard, validate_acquire
from mayfly.queues import QueueSettings, QueueUsage, check_held
from mayfly.queues import check_queue_name as _check_queue
from mayfly.runindex import IndexEntry, IndexStatus, check_claim
from mayfly.substrate import GroupCommit
from mayfly_postgres._index import (
    IndexStatements,
    PostgresWakeupListener,
    batch_parameters,
    check_entries,
    claimable_now,
    entry_parameters,
    row_entry,
)
from mayfly_postgres._lease import PostgresLeaseStore
from mayfly_postgres._pool import HubConnection, in_hub_task, is_transient, pause, unavailable
from mayfly_postgres._schedules import PostgresSchedules, ScheduleStatements
from mayfly_postgres._store import Store, open_store, rendered
from mayfly_postgres._tails import TailStatements, read_tails
from mayfly_postgres._wire import WireStatement, send_together

__all__ = ["PostgresJournal", "RunSummary", "relayed_url"]

_RETRY_CEILING_S: Final = 1.0
_MAX_UNEXPLAINED: Final = 5
# updated_at moves at most once a second: an append that changes no indexed column is a HOT
# update of the run row, so a busy run does not rewrite the inspection indexes on every append.
_TOUCH: Final = "CASE WHEN {0} > now() - interval '1 second' AND {0} <= now() THEN {0} ELSE now() END"
_COLUMNS: Final = "sequence, event_id::text, event_type, schema_version, payload, checksum"
_NIL_RUN: Final = "00000000-0000-0000-0000-000000000000"
# A bytea[] literal's elements, each quoted: an escaped backslash (two in the literal), x, the bytes in hex.
_BYTEA_OPEN: Final = '{"\\\\x'
_BYTEA_NEXT: Final = '","\\\\x'


@final
class _OnceEntry:
    """The caller's ``index()``, called at most once (an append retried after a lost reply reuses it)."""

    __slots__ = ("_entry", "_make")

    def __init__(self, make: Callable[[], IndexEntry]) -> None:
        self._make = make
        self._entry: IndexEntry | None = None

    def get(self) -> IndexEntry:
        if self._entry is None:
            self._entry = self._make()
        return self._entry


_Item: TypeAlias = tuple[str, int, tuple[JournalRecord, ...], int | None, _OnceEntry | None]
"""One queued append: run id, expected next sequence, batch, fencing token, run-index entry."""


def _run_of(item: _Item) -> str:
    """A queued append's run: one group transaction holds at most one batch per run."""
    return item[0]


def _inspection(batch: Sequence[JournalRecord]) -> tuple[str | None, str | None]:
    """The workflow id and status a batch sets in the inspection index (best effort, never fatal)."""
    workflow: str | None = None
    status: str | None = None
    for record in batch:
        if record.event_type not in ("RunCreated", "RunCompleted"):
            continue
        try:
            body = json.loads(record.payload)
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        if record.event_type == "RunCreated":
            spec = body.get("spec")
            found = spec.get("workflow_id") if isinstance(spec, dict) else None
            workflow = found if isinstance(found, str) else workflow
            status = "running"
        else:
            result = body.get("result")
            status = result if isinstance(result, str) else status
    return workflow, status


@final
class _Prepared:
    """One append's statement and parameters, as sent alone or in a group."""

    __slots__ = ("counted", "statement", "values")

    def __init__(self, statement: WireStatement, parameters: dict[str, Any], *, counted: bool) -> None:
        self.statement = statement
        self.values = statement.values(parameters)
        self.counted = counted
        """Whether the statement answers with the count of records inserted (else its row count says it)."""

    def inserted(self, result: pq.abc.PGresult) -> int:
        """How many records the statement inserted."""
        if not self.counted:
            return result.command_tuples or 0
        count = result.get_value(0, 0)
        assert count is not None  # the statement answers with one row, a count
        return int(count)


def _is_dedup(violation: psycopg.errors.UniqueViolation) -> bool:
    """Whether a unique violation is the dedup index's (a second live run with a queue's dedup id)."""
    return violation.diag.constraint_name == "run_index_dedup"


def _settings_row(row: Sequence[Any], *, stored: bool = True) -> QueueSettings:
    """The settings one ``queues`` row holds, validated (``stored=False``: values to store, InvalidRecord)."""
    name, concurrency, worker_concurrency, rate_limit, rate_period_ms, priority = row
    try:
        return QueueSettings(
            name=name,
            concurrency=concurrency,
            worker_concurrency=worker_concurrency,
            rate_limit=rate_limit,
            rate_period_ms=rate_period_ms,
            priority=priority,
        )
    except InvalidRecord as exc:
        if not stored:
            raise
        raise CorruptionError(
            f"queue settings row {name!r:.80} is invalid ({exc}); set them again with `mayfly queue set`"
        ) from None


def _unverified(run: str, columns: Sequence[Any]) -> JournalRecord:
    """The record one row holds (sequence, event id, type, version, payload, checksum), not yet verified.

    The run id is the one the row was selected by, and every other column is
    covered by the record checksum, so the kit's ``verified`` turns a row
    changed in place into ``ChecksumMismatch`` naming run and sequence.
    """
    sequence, event_id, event_type, version, payload, checksum = columns
    return JournalRecord(
        run_id=run,
        sequence=int(sequence),
        event_id=event_id,
        event_type=event_type,
        schema_version=int(version),
        payload=bytes(payload),
        checksum=checksum,
    )


def relayed_url(settings: Any, relay: Relay) -> str:
    """The URL of ``settings`` (password kept) with its server replaced by ``relay(host, port)``."""
    source = settings.source
    if source is None or source.host is None:
        raise InvalidRecord(f"{settings.url} names no TCP host and port to relay")
    host, port = relay(source.host, source.port or 5432)
    return str(source.with_server(host, port))


class _Statements:
    """The journal's SQL, composed once per schema with quoted identifiers."""

    @staticmethod
    def _first_bump(runs: sql.Identifier, extra: str) -> sql.Composed:
        """The ``bump`` CTE of a run's first batch (``extra``: one more condition on the row)."""
        return sql.SQL(
            "bump AS (INSERT INTO {runs} AS r (run_id, next_sequence, workflow_id, status) "
            "SELECT %(run)s::uuid, %(next)s::bigint, %(workflow)s::text, %(status)s::text "
            "WHERE (%(fence)s::bigint = 0 OR EXISTS (SELECT FROM {runs} WHERE run_id = %(run)s::uuid))"
            + extra
            + " ON CONFLICT (run_id) DO UPDATE SET next_sequence = EXCLUDED.next_sequence, "
            "updated_at = "
            + _TOUCH.format("r.updated_at")
            + ", workflow_id = COALESCE(EXCLUDED.workflow_id, r.workflow_id), "
            "status = COALESCE(EXCLUDED.status, r.status) "
            "WHERE r.next_sequence = 1 AND r.fence = %(fence)s::bigint RETURNING 1)"
        ).format(runs=runs)

    @staticmethod
    def _next_bump(runs: sql.Identifier, extra: str) -> sql.Composed:
        """The ``bump`` CTE of a later batch (``extra``: one more condition on the row)."""
        return sql.SQL(
            "bump AS (UPDATE {runs} SET next_sequence = %(next)s::bigint, updated_at = "
            + _TOUCH.format("updated_at")
            + ", "
            "workflow_id = COALESCE(%(workflow)s::text, workflow_id), "
            "status = COALESCE(%(status)s::text, status) "
            "WHERE run_id = %(run)s::uuid AND next_sequence = %(expected)s::bigint "
            "AND fence = %(fence)s::bigint" + extra + " RETURNING 1)"
        ).format(runs=runs)

    def __init__(self, store: Store, index: IndexStatements) -> None:
        runs, records, snapshots = store.table("runs"), store.table("records"), store.table("snapshots")
        insert = sql.SQL(
            "INSERT INTO {records} (run_id, sequence, event_id, event_type, schema_version, payload, "
            "checksum) SELECT %(run)s::uuid, v.* FROM unnest(%(sequences)s::bigint[], "
            "%(event_ids)s::uuid[], %(types)s::text[], %(versions)s::bigint[], %(payloads)s::bytea[], "
            "%(checksums)s::text[]) AS v WHERE EXISTS (SELECT FROM bump)"
        ).format(records=records)
        # A run row may exist before its first record (a lease grant creates it with its fence).
        # The appends go on the wire as prepared statements (mayfly_postgres._wire).
        self.append_first = WireStatement(
            rendered(sql.SQL("WITH ") + self._first_bump(runs, "") + sql.SQL(" ") + insert)
        )
        self.append_next = WireStatement(
            rendered(sql.SQL("WITH ") + self._next_bump(runs, "") + sql.SQL(" ") + insert)
        )
        # An indexed append: the same after locking the run's index entry (the uncorrelated subquery is
        # a one-time filter, run before the run row is locked, so appends and claims lock entry then
        # run: no deadlock), carrying the run's entry, upserted only if the batch was inserted, and
        # telling the listeners when asked (indexed[first batch, announce]); it answers with the count
        # of records inserted.
        locked = sql.SQL(
            "WITH locked AS (SELECT FROM {index} WHERE run_id = %(run)s::uuid FOR UPDATE), "
        ).format(index=store.table("run_index"))
        first_locked = self._first_bump(runs, " AND (SELECT count(*) FROM locked) >= 0")
        next_locked = self._next_bump(runs, " AND (SELECT count(*) FROM locked) >= 0")
        appended = sql.SQL(", appended AS (") + insert + sql.SQL(" RETURNING 1)")
        count = sql.SQL(" SELECT (SELECT count(*) FROM appended)")
        told = sql.SQL(" SELECT (SELECT count(*) FROM appended), (SELECT count(*) FROM told)")
        self.indexed: dict[tuple[bool, bool], WireStatement] = {}
        for first, bump in ((True, first_locked), (False, next_locked)):
            put = locked + bump + appended + sql.SQL(", ") + index.put_appended
            self.indexed[first, False] = WireStatement(rendered(put + count))
            self.indexed[first, True] = WireStatement(rendered(put + sql.SQL(", ") + index.announce + told))
        # One statement, one snapshot: the run row and every stored record the batch names,
        # by event id or by sequence, whole, so a re-append is compared with verified records.
        self.diagnose = sql.SQL(
            "SELECT next_sequence, fence, NULL::bigint, NULL::text, NULL::text, NULL::bigint, "
            "NULL::bytea, NULL::text FROM {runs} WHERE run_id = %(run)s::uuid "
            "UNION ALL SELECT NULL, NULL, " + _COLUMNS + " FROM {records} "
            "WHERE run_id = %(run)s::uuid AND (event_id = ANY(%(event_ids)s::uuid[]) "
            "OR sequence BETWEEN %(first)s::bigint AND %(last)s::bigint)"
        ).format(runs=runs, records=records)
        # The run's next sequence comes in the same snapshot as the records (at least one row even
        # for an empty window), so a record missing at the end of the run is found too.
        self.read = rendered(
            sql.SQL(
                "SELECT h.next_sequence, r.* FROM (SELECT COALESCE((SELECT next_sequence FROM {runs} "
                "WHERE run_id = %(run)s::uuid), 1) AS next_sequence) AS h LEFT JOIN LATERAL (SELECT "
                + _COLUMNS
                + " FROM {records} WHERE run_id = %(run)s::uuid AND sequence > %(after)s::bigint "
                "ORDER BY sequence LIMIT %(limit)s::bigint) AS r ON true"
            ).format(runs=runs, records=records)
        )
        self.next_sequence = rendered(
            sql.SQL("SELECT next_sequence FROM {runs} WHERE run_id = %s::uuid").format(runs=runs)
        )
        self.list_first = sql.SQL(
            "SELECT run_id::text AS id FROM {runs} WHERE next_sequence > 1 ORDER BY run_id LIMIT %s::bigint"
        ).format(runs=runs)
        self.list_after = sql.SQL(
            "SELECT run_id::text AS id FROM {runs} WHERE next_sequence > 1 AND run_id > %s::uuid "
            "ORDER BY run_id LIMIT %s::bigint"
        ).format(runs=runs)
        self.write_snapshot = rendered(
            sql.SQL(
                "INSERT INTO {snapshots} AS s (run_id, schema_version, last_sequence, last_event_id, "
                "last_record_checksum, spec_checksum, state_checksum, state, checksum) VALUES "
                "(%s::uuid, %s, %s, %s::uuid, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET "
                "schema_version = EXCLUDED.schema_version, last_sequence = EXCLUDED.last_sequence, "
                "last_event_id = EXCLUDED.last_event_id, "
                "last_record_checksum = EXCLUDED.last_record_checksum, "
                "spec_checksum = EXCLUDED.spec_checksum, state_checksum = EXCLUDED.state_checksum, "
                "state = EXCLUDED.state, checksum = EXCLUDED.checksum, written_at = now()"
            ).format(snapshots=snapshots)
        )
        self.read_snapshot = rendered(
            sql.SQL(
                "SELECT schema_version, last_sequence, last_event_id::text, last_record_checksum, "
                "spec_checksum, state_checksum, state, checksum FROM {snapshots} WHERE run_id = %s::uuid"
            ).format(snapshots=snapshots)
        )
        self.corrupt_record = sql.SQL(
            "UPDATE {records} SET payload = convert_to('\"corrupt\"', 'UTF8') "
            "WHERE run_id = %s::uuid AND sequence = %s"
        ).format(records=records)
        self.remove_record = sql.SQL(
            "DELETE FROM {records} WHERE run_id = %s::uuid AND sequence = %s"
        ).format(records=records)
        self.corrupt_snapshot = sql.SQL(
            "UPDATE {snapshots} SET state = state || '\\x00'::bytea WHERE run_id = %s::uuid"
        ).format(snapshots=snapshots)
        self.purge = sql.SQL(
            "WITH run AS (SELECT run_id FROM {runs} WHERE run_id = %(run)s::uuid FOR UPDATE), "
            "held AS (SELECT l.owner FROM {leases} l JOIN run USING (run_id) "
            "WHERE l.expires_at > clock_timestamp()), "
            "gone AS (DELETE FROM {records} WHERE run_id = %(run)s::uuid AND NOT EXISTS (SELECT FROM held) "
            "RETURNING 1), "
            "unsnapped AS (DELETE FROM {snapshots} WHERE run_id = %(run)s::uuid "
            "AND NOT EXISTS (SELECT FROM held) RETURNING 1), "
            "unindexed AS (DELETE FROM {run_index} WHERE run_id = %(run)s::uuid "
            "AND NOT EXISTS (SELECT FROM held)), "
            "reset AS (UPDATE {runs} SET next_sequence = 1, workflow_id = NULL, status = NULL "
            "WHERE run_id = %(run)s::uuid AND next_sequence > 1 AND NOT EXISTS (SELECT FROM held) "
            "RETURNING 1) "
            "SELECT (SELECT owner FROM held LIMIT 1), (SELECT count(*) FROM gone) + "
            "(SELECT count(*) FROM unsnapped) + (SELECT count(*) FROM reset)"
        ).format(
            runs=runs,
            records=records,
            snapshots=snapshots,
            leases=store.table("leases"),
            run_index=store.table("run_index"),
        )
        self.summaries = sql.SQL(
            "SELECT run_id::text AS id, workflow_id, status, next_sequence - 1, created_at, updated_at "
            "FROM {runs} WHERE next_sequence > 1 {filters} ORDER BY updated_at DESC, run_id LIMIT %s::bigint"
        )
        self.runs = runs


@final
class PostgresJournal(PostgresSchedules, JournalBase):
    """A ``WorkflowJournal`` on PostgreSQL, safe across threads, processes and hosts.

    Open it with a ``postgresql://`` URL (see :func:`mayfly_postgres.parse_url`
    for the options). Appends are acknowledged after the commit is durable
    under the URL's ``durability``; every driver error is mapped to a Mayfly
    error; the network waits of a hub task park on the hub. Declares
    everything, plus run summaries (``run_summaries``), many runs' tails in one
    statement (``run_tails``; see :mod:`mayfly_postgres._tails`), run purging,
    ``network``, and the run index workers claim from (``run_index``,
    ``run_wakeups``, and ``append_wakeups``: a run's creation notifies in its own
    statement; see :mod:`mayfly_postgres._index`).
    """

    remedy = "restore the run's rows from a backup"

    def __init__(self, url: str) -> None:
        self._store = open_store(url)
        self._index_sql = IndexStatements(self._store)
        self._sql = _Statements(self._store, self._index_sql)
        self._schedule_sql = ScheduleStatements(self._store)
        self._tail_sql = TailStatements(self._store)
        self._leases: PostgresLeaseStore | None = None
        self._leases_lock = threading.Lock()
        # Group transactions in flight at once, each on its own connection: half the pool,
        # so reads, claims and grants still find connections.
        self._group: GroupCommit[_Item, AppendResult] = GroupCommit(
            self._flush_group,
            name="postgres-journal",
            key=_run_of,
            offload=False,
            flushers=max(1, self._store.settings.pool_size // 2),
        )
        super().__init__(
            url=self._store.settings.url,
            capabilities=JournalCapabilities.declare(
                self._store.settings.durability,
                "cross_process fencing crash_durable fault_injection snapshots lease_expiry",
                "run_summaries run_purge network run_index run_wakeups append_wakeups queue_control",
                "schedule_store",
                "run_tails",
            ),
        )

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding this journal's tables."""
        return self._store.settings.schema

    def relayed(self, relay: Relay) -> WorkflowJournal:
        """Open another journal on the same schema whose connections dial ``relay(host, port)``."""
        return PostgresJournal(relayed_url(self._store.settings, relay))

    # -- appends ------------------------------------------------------------------------

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        """Compare-and-append an atomic batch under the run's fencing token (see the module doc)."""
        if in_hub_task():
            return self._group.submit((run_id, expected_next, batch, fence, None))
        return self._append_batch(run_id, expected_next, batch, fence, None)

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        """The append, and the run's index entry in the same transaction (see the module doc)."""
        if in_hub_task():
            return self._group.submit((run_id, expected_next, batch, fence, _OnceEntry(entry)))
        return self._append_batch(run_id, expected_next, batch, fence, _OnceEntry(entry))

    # -- group commit: many runs' appends in one transaction -----------------------------

    def _flush_group(self, items: Sequence[_Item]) -> list[AppendResult | BaseException]:
        """Append a group of batches (one per run) in one transaction: one commit, one round trip.

        Runs in the group-commit flusher task (:class:`~mayfly.substrate.GroupCommit`,
        on the hub). A lone batch takes the usual path. A group is sent on one
        connection as one pipeline whose statements run in one implicit
        transaction, committed by the Sync that ends it: every batch's
        statement, in run-id order (so two groups lock rows in one order, and
        with claims entry before run), the same one as alone, each carrying its
        run's index entry. Only the batches whose statement inserted them are
        acknowledged from the group's commit. Every other batch — refused by
        its statement (a stale fence, a lost race, an exact re-append), or all
        of them when the transaction failed (an event id already used, a dedup
        id held, a lost connection, even during the commit) — then takes the
        usual path on its own, which classifies it, retries it, or recognises
        it as already committed (an exact re-append), so a batch is never
        written twice and one run's refusal never fails another's append.
        """
        if len(items) == 1:
            return [self._outcome(items[0])]
        outcomes: list[AppendResult | BaseException | None] = [None] * len(items)
        now_ms = int(time.time() * 1000)
        sent: list[tuple[_Item, _Prepared]] = []
        positions: list[int] = []
        for i in sorted(range(len(items)), key=lambda i: items[i][0]):
            try:
                prepared = self._prepare(*items[i], now_ms=now_ms)
            except Exception as error:  # the caller's index entry failed: its append alone fails
                outcomes[i] = error
                continue
            sent.append((items[i], prepared))
            positions.append(i)
        try:
            counts = self._append_together(sent)
        except psycopg.Error:
            counts = [0] * len(sent)  # nothing of the group was committed, or it is unknown
        for i, (item, _), count in zip(positions, sent, counts, strict=True):
            run_id, expected_next, batch, _, _ = item
            if outcomes[i] is not None:
                continue
            if count == len(batch):
                outcomes[i] = self.acknowledged(run_id, batch)
            elif count:
                outcomes[i] = self._partial(run_id, expected_next, count, len(batch))
            else:
                outcomes[i] = self._outcome(item)
        return [JournalUnavailable("not attempted") if o is None else o for o in outcomes]

    def _outcome(self, item: _Item) -> AppendResult | BaseException:
        try:
            return self._append_batch(*item)
        except Exception as error:  # this batch's outcome, raised in its own caller
            return error

    def _append_together(self, sent: Sequence[tuple[_Item, _Prepared]]) -> list[int]:
        """Send the statements in one transaction (see ``_flush_group``); the records each inserted.

        Raises the driver's error if the transaction failed: then nothing of it
        was committed (or, the connection lost during the commit, it is not
        known whether it was).
        """
        with self._store.pool.connection() as connection:
            results = send_together(connection, [(p.statement, p.values) for _, p in sent])
        return [p.inserted(result) for (_, p), result in zip(sent, results, strict=True)]

    def _prepare(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: _OnceEntry | None,
        *,
        now_ms: int,
    ) -> _Prepared:
        """An append's statement and parameters; an indexed batch carries its run's entry.

        The entry is asked for here, before the statement is sent (asking
        changes nothing, see :meth:`mayfly.runindex.RunIndexJournal.append_indexed`),
        and the statement stores it only if it inserted the batch. A run made
        claimable at once without a lease (none to release first) is announced
        to listening workers in the same statement.
        """
        parameters = self._parameters(run_id, expected_next, batch, fence)
        if entry is None:
            statement = self._sql.append_first if expected_next == 1 else self._sql.append_next
            return _Prepared(statement, parameters, counted=False)
        value = entry.get()
        entry_parameters(value, parameters)
        announce = fence is None and claimable_now(value, now_ms)
        return _Prepared(self._sql.indexed[expected_next == 1, announce], parameters, counted=True)

    def _partial(self, run_id: str, expected_next: int, inserted: int, count: int) -> CorruptionError:
        return CorruptionError(
            f"{self.url}: append to run {run_id} at sequence {expected_next} inserted "
            f"{inserted} of {count} records, which one statement cannot do against an "
            "intact schema; stop writers and inspect the run's rows"
        )

    def _append_batch(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: _OnceEntry | None,
    ) -> AppendResult:
        """One append alone, classified when refused, retried after a lost connection.

        One statement (its run's index entry included) and one round trip.
        """
        now_ms = int(time.time() * 1000)
        prepared = self._prepare(run_id, expected_next, batch, fence, entry, now_ms=now_ms)
        acknowledged = self.acknowledged(run_id, batch)
        pool = self._store.pool
        deadline = time.monotonic() + self._store.settings.reconnect_timeout
        delay = 0.05
        unexplained = 0
        while True:
            inserted = 0
            try:
                with pool.connection() as connection:
                    (result,) = send_together(connection, [(prepared.statement, prepared.values)])
                    inserted = prepared.inserted(result)
            except psycopg.errors.UniqueViolation as violation:
                if entry is not None and _is_dedup(violation):
                    raise self._duplicate(entry.get()) from None
                inserted = 0  # an event id already used in the run: classified below
            except psycopg.IntegrityError:
                inserted = 0  # an event id already used in the run: classified below
            except psycopg.Error as error:
                if not is_transient(error):
                    raise unavailable(self.url, f"append to run {run_id}", error) from None
                # The statement may or may not have committed before the connection went away.
                if self._committed(run_id, batch, deadline, error):
                    return acknowledged
                if time.monotonic() + delay > deadline:
                    raise unavailable(self.url, f"append to run {run_id}", error) from None
                pause(delay)
                delay = min(delay * 2, _RETRY_CEILING_S)
                continue
            if inserted == len(batch):
                return acknowledged
            if inserted != 0:
                raise self._partial(run_id, expected_next, inserted, len(batch))
            outcome = self._classify(run_id, expected_next, batch, fence)
            if outcome is not None:
                return outcome
            # The row changed between the append and the diagnosis (a grant, a racer); try again,
            # but a refusal that keeps contradicting the run row means the tables disagree.
            unexplained += 1
            if unexplained >= _MAX_UNEXPLAINED:
                raise CorruptionError(
                    f"{self.url}: append to run {run_id} at sequence {expected_next} is refused by the "
                    "records table although runs.next_sequence and the fence allow it; the tables "
                    "disagree, inspect the run's rows before writing again"
                )

    @staticmethod
    def _parameters(
        run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> dict[str, Any]:
        """The compare-and-append statement's parameters for one batch."""
        workflow, status = _inspection(batch)
        # The arrays go as array literals the statement casts: psycopg's list dumping (in Python, per
        # element) cost more than a third of an append's client CPU. Every element is validated by
        # validate_batch before an append gets here (integers, UUIDs, [A-Za-z][A-Za-z0-9]* event
        # types, hex checksums), so quoting alone spells it; payloads go hex-encoded, as bytea's
        # text input reads them.
        return {
            "run": run_id,
            "expected": expected_next,
            "next": expected_next + len(batch),
            "fence": 0 if fence is None else fence,
            "workflow": workflow,
            "status": status,
            "sequences": "{" + ",".join([str(r.sequence) for r in batch]) + "}",
            "event_ids": '{"' + '","'.join([r.event_id for r in batch]) + '"}',
            "types": '{"' + '","'.join([r.event_type for r in batch]) + '"}',
            "versions": "{" + ",".join([str(r.schema_version) for r in batch]) + "}",
            "payloads": _BYTEA_OPEN + _BYTEA_NEXT.join([r.payload.hex() for r in batch]) + '"}',
            "checksums": '{"' + '","'.join([r.checksum for r in batch]) + '"}',
        }

    def _committed(
        self,
        run_id: str,
        batch: Sequence[JournalRecord],
        deadline: float,
        cause: BaseException,
    ) -> bool:
        """Whether the batch is committed exactly, read back on a fresh connection (retried to deadline)."""
        delay = 0.05
        while True:
            try:
                _, stored = self._diagnose(run_id, batch)
            except JournalUnavailable:
                if time.monotonic() + delay > deadline:
                    raise JournalUnavailable(
                        f"{self.url}: append to run {run_id} lost its connection during commit "
                        f"({type(cause).__name__}) and the outcome could not be read back before "
                        "reconnect_timeout; re-append the same records to resolve it (exact re-append "
                        "is idempotent)"
                    ) from None
                pause(delay)
                delay = min(delay * 2, _RETRY_CEILING_S)
                continue
            present = [stored.get(r.sequence) == r for r in batch]
            if all(present):
                return True
            if any(present):
                raise ConflictingRecord(
                    f"append to run {run_id}: after a lost connection only part of the batch "
                    f"(sequences {batch[0].sequence}..{batch[-1].sequence}) reads back; the journal "
                    "is inconsistent, stop writers and inspect the run"
                )
            return False

    def _diagnose(
        self, run_id: str, batch: Sequence[JournalRecord]
    ) -> tuple[tuple[int, int], dict[int, JournalRecord]]:
        """The run's (next sequence, fence) and the stored records the batch names, by sequence.

        Every stored record at one of the batch's event ids or sequences is
        verified whole first, so a damaged row raises ``ChecksumMismatch``
        instead of passing for the record it once was.
        """

        def query(connection: HubConnection) -> list[tuple[Any, ...]]:
            return connection.execute(
                self._sql.diagnose,
                {
                    "run": run_id,
                    "event_ids": [r.event_id for r in batch],
                    "first": batch[0].sequence,
                    "last": batch[-1].sequence,
                },
            ).fetchall()

        rows = self._store.pool.retrying(f"reading run {run_id} back", query)
        run_row = (1, 0)
        stored: dict[int, JournalRecord] = {}
        for next_sequence, fence, *columns in rows:
            if next_sequence is not None:
                run_row = (int(next_sequence), int(fence))
                continue
            record = self.verified(_unverified(run_id, columns))  # whichever event it holds
            stored[record.sequence] = record
        return run_row, stored

    def _classify(
        self, run_id: str, expected_next: int, batch: Sequence[JournalRecord], fence: int | None
    ) -> AppendResult | None:
        """Raise the typed reason nothing was inserted, return an idempotent ack, or None to retry."""
        (actual_next, current), stored = self._diagnose(run_id, batch)
        self.check_fence(run_id, fence, current)
        by_event = {record.event_id: record.sequence for record in stored.values()}
        if expected_next != actual_next:
            return self.refused(
                run_id,
                expected_next,
                tuple(batch),
                actual_next=actual_next,
                stored_at=stored.get,
                sequence_of=by_event.get,
            )
        for record in batch:
            if record.event_id in by_event:
                raise self.event_id_taken(run_id, record.event_id, by_event[record.event_id])
        return None

    # -- reads ----------------------------------------------------------------------------

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        """Records after ``after`` in order, each verified, against the run's ``next_sequence``.

        The run's ``next_sequence`` is read in the same snapshot, so a record
        missing at the end of the run is a gap too, never a shorter history.
        """

        def query(connection: HubConnection) -> list[tuple[Any, ...]]:
            return connection.execute(
                self._sql.read, {"run": run_id, "after": after, "limit": limit}
            ).fetchall()

        rows = self._store.pool.retrying(f"reading run {run_id}", query)
        return self.window(
            run_id,
            after,
            limit,
            self._windowed(rows),
            lambda _, columns: self.verified(_unverified(run_id, columns)),
            next_sequence=int(rows[0][0]),
        )

    @staticmethod
    def _windowed(rows: list[tuple[Any, ...]]) -> Iterator[tuple[int, Sequence[Any]]]:
        for _, *columns in rows:
            if columns[0] is None:
                return  # the empty window's one row
            yield columns[0], columns

    def _next_sequence(self, run_id: str) -> int:
        run = run_id

        def query(connection: HubConnection) -> int:
            row = connection.execute(self._sql.next_sequence, (run,)).fetchone()
            return 1 if row is None else int(row[0])

        return self._store.pool.retrying(f"reading run {run}", query)

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        start = after

        def query(connection: HubConnection) -> list[str]:
            if start is None:
                rows = connection.execute(self._sql.list_first, (limit,)).fetchall()
            else:
                rows = connection.execute(self._sql.list_after, (start, limit)).fetchall()
            return [str(row[0]) for row in rows]

        return self._store.pool.retrying("listing runs", query)

    def run_summaries(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        updated_before: datetime.datetime | None = None,
        limit: int = 100,
    ) -> list[RunSummary]:
        """The most recently updated runs, newest first, optionally filtered by status and workflow.

        Page with ``updated_before`` set to the last row's ``updated_at``.
        Served by the ``runs`` indexes on (status, updated_at),
        (workflow_id, updated_at) and (updated_at).
        """
        self.check_limit("run_summaries", limit)
        self.ensure_open("listing run summaries")
        filters: list[sql.Composable] = []
        arguments: list[object] = []
        for column, value in (("status", status), ("workflow_id", workflow_id)):
            if value is not None:
                if not isinstance(value, str):
                    raise InvalidRecord(f"run_summaries {column} must be a str, got {type(value).__name__}")
                filters.append(sql.SQL("AND {} = %s").format(sql.Identifier(column)))
                arguments.append(value)
        if updated_before is not None:
            filters.append(sql.SQL("AND updated_at < %s"))
            arguments.append(updated_before)
        statement = self._sql.summaries.format(runs=self._sql.runs, filters=sql.SQL(" ").join(filters))

        def query(connection: HubConnection) -> list[RunSummary]:
            rows = connection.execute(statement, (*arguments, limit)).fetchall()
            return [RunSummary(str(r[0]), r[1], r[2], int(r[3]), r[4], r[5]) for r in rows]

        return self._store.pool.retrying("listing run summaries", query)

    def _read_tails(
        self, run_ids: tuple[str, ...]
    ) -> list[tuple[SnapshotRecord | SnapshotCorrupt | None, list[JournalRecord]]]:
        """Every run's snapshot and tail in one statement (see :mod:`mayfly_postgres._tails`)."""
        return read_tails(
            self._store,
            self._tail_sql,
            run_ids,
            self.window,
            lambda run, columns: self.verified(_unverified(run, columns)),
        )

    # -- snapshots ------------------------------------------------------------------------

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        arguments = (
            run_id,
            snapshot.schema_version,
            snapshot.last_sequence,
            snapshot.last_event_id,
            snapshot.last_record_checksum,
            snapshot.spec_checksum,
            snapshot.state_checksum,
            snapshot.state,
            snapshot.checksum,
        )
        self._execute(f"writing the snapshot of run {run_id}", self._sql.write_snapshot, arguments)

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        run = run_id

        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._sql.read_snapshot, (run,)).fetchone()

        row = self._store.pool.retrying(f"reading the snapshot of run {run}", query)
        if row is None:
            return None
        version, last_sequence, last_event, last_checksum, spec, state_checksum, state, checksum = row
        snapshot = SnapshotRecord(
            run_id=run,
            schema_version=int(version),
            last_sequence=int(last_sequence),
            last_event_id=last_event,
            last_record_checksum=last_checksum,
            spec_checksum=spec,
            state_checksum=state_checksum,
            state=bytes(state),
            checksum=checksum,
        )
        return snapshot  # verified by the base

    # -- purging (capabilities.run_purge) ---------------------------------------------------

    def purge_run(self, run_id: str) -> bool:
        """Delete the run's records and snapshot and reset its row in one statement; the fence stays.

        The statement locks the run's row first, so it is ordered against
        appends and grants; a lease that has not expired raises ``LeaseHeld``
        and nothing changes. The lease row stays, expired, because it holds the
        token counter that keeps tokens monotonic.
        """
        run = self.open_run(run_id, "purge")

        def query(connection: HubConnection) -> tuple[Any, ...]:
            row = connection.execute(self._sql.purge, {"run": run}).fetchone()
            assert row is not None  # the statement always returns one row
            return row

        holder, removed = self._store.pool.retrying(f"purging run {run}", query)
        if holder is not None:
            raise LeaseHeld(run, str(holder))
        return int(removed) > 0

    # -- fault injection (capabilities.fault_injection; never in production) ----------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Change one stored payload without updating its checksum."""
        run = self.open_run(run_id, "fault injection")
        self._execute("corrupting a record", self._sql.corrupt_record, (run, sequence))

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap."""
        run = self.open_run(run_id, "fault injection")
        self._execute("removing a record", self._sql.remove_record, (run, sequence))

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored snapshot state so its checksum no longer matches."""
        run = self.open_run(run_id, "fault injection")
        self._execute("corrupting a snapshot", self._sql.corrupt_snapshot, (run,))

    def _execute(
        self, doing: str, statement: sql.Composed | bytes, arguments: Sequence[object] | dict[str, Any]
    ) -> None:
        def run(connection: HubConnection) -> None:
            connection.execute(statement, arguments)

        self._store.pool.retrying(doing, run)

    # -- the run index (mayfly.runindex) ----------------------------------------------------

    def _lease_store(self) -> PostgresLeaseStore:
        """The lease store claimed guards belong to, on this journal's pool (opened on first claim)."""
        with self._leases_lock:
            if self._leases is None:
                self._leases = PostgresLeaseStore(self._store)
            return self._leases

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
        """Lease up to ``limit`` claimable root runs to ``owner`` in claim order: one statement.

        Each lease expires ``ttl_ms`` after the grant on the server's clock,
        as the lease store's do; ``now_ms`` (wall ms) decides which wake times
        have come and is the start recorded on runs claimed for the first
        time. Queue limits apply (:mod:`mayfly.queues`; ``held``: the runs of
        each queue the claimant holds). A lost connection raises
        ``JournalUnavailable``: a claim whose reply was lost may have granted
        leases nobody holds, which expire after ``ttl_ms``.
        """
        limit, names = check_claim(limit, queues)
        holding = check_held(held)
        _, owner, ttl = validate_acquire(_NIL_RUN, owner, ttl_ms)
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidRecord(f"claim now_ms must be an int (wall-clock Unix ms), got {now_ms!r}")
        self.ensure_open("claim")
        leases = self._lease_store()
        arguments = {
            "now": now_ms,
            "queues": None if names is None else list(names),
            "limit": limit,
            "owner": owner,
            "ttl": ttl,
            "held_names": list(holding),
            "held_counts": list(holding.values()),
        }
        try:
            with self._store.pool.connection() as connection:
                rows = connection.execute(self._index_sql.claim, arguments).fetchall()
        except psycopg.Error as error:
            raise unavailable(self.url, f"claiming runs for {owner}", error) from None
        return [
            leases.adopt(str(run), owner, token=int(token), ttl_ms=ttl, grant=str(grant))
            for run, token, grant in rows
        ]

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest wake time after ``now_ms`` of a waiting root run (``None``: none has one)."""
        _, names = check_claim(1, queues)
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidRecord(f"next_wake now_ms must be an int (wall-clock Unix ms), got {now_ms!r}")
        self.ensure_open("reading the next wake time")
        arguments = {"now": now_ms, "queues": None if names is None else list(names)}

        def query(connection: HubConnection) -> int | None:
            row = connection.execute(self._index_sql.next_wake, arguments).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return self._store.pool.retrying("reading the next wake time", query)

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        run = self.open_run(run_id, "reading the run index")

        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._index_sql.get, (run,)).fetchone()

        row = self._store.pool.retrying(f"reading the index entry of run {run}", query)
        return None if row is None else row_entry(row)

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries in one statement; a lower sequence never replaces a stored one, a wake is kept."""
        folded = check_entries(entries)
        self.ensure_open("writing the run index")
        if not folded:
            return
        now = int(time.time() * 1000)
        announce = any(claimable_now(entry, now) for entry in folded)
        statement = self._index_sql.put_notify if announce else self._index_sql.put
        arguments = batch_parameters(folded)

        def run(connection: HubConnection) -> bool:
            try:
                connection.execute(statement, arguments)
            except psycopg.errors.UniqueViolation as violation:
                if not _is_dedup(violation):
                    raise
                return False  # the statement wrote nothing
            return True

        if self._store.pool.retrying(f"writing {len(folded)} run index entries", run):
            return
        # An entry would be a second live run with its queue's dedup id: name one such entry.
        refusals = [
            self._duplicate(candidate)
            for candidate in folded
            if candidate.dedup_id is not None and candidate.status is not IndexStatus.TERMINAL
        ]
        raise next((r for r in refusals if r.live_run_id is not None), refusals[0])

    def _duplicate(self, entry: IndexEntry) -> DuplicateRun:
        """The refusal of ``entry``, naming the live run holding its dedup id (read after the rollback)."""
        assert entry.dedup_id is not None
        arguments = (entry.queue, entry.dedup_id, entry.run_id)

        def query(connection: HubConnection) -> str | None:
            row = connection.execute(self._index_sql.dedup_holder, arguments).fetchone()
            return None if row is None else str(row[0])

        live = self._store.pool.retrying(f"reading the run holding dedup id {entry.dedup_id!r}", query)
        return DuplicateRun(entry.run_id, entry.queue, entry.dedup_id, live)

    # -- queue flow control (capabilities.queue_control; mayfly.queues.QueueControl) -------------

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings in one statement, replacing any; claims obey them from now on.

        A claim holding the queue's row lock finishes first (the upsert waits
        for it), so no claim counts against half-old, half-new settings.
        """
        if not isinstance(settings, QueueSettings):
            raise InvalidRecord(f"queue settings must be a QueueSettings, got {type(settings).__name__}")
        # Validated again field by field (InvalidRecord), whatever built the value: the table's CHECK
        # constraints would refuse it otherwise, but as a driver error.
        settings = _settings_row(
            (
                settings.name,
                settings.concurrency,
                settings.worker_concurrency,
                settings.rate_limit,
                settings.rate_period_ms,
                settings.priority,
            ),
            stored=False,
        )
        self.ensure_open("queue settings")
        arguments = {
            "name": settings.name,
            "concurrency": settings.concurrency,
            "worker_concurrency": settings.worker_concurrency,
            "rate_limit": settings.rate_limit,
            "rate_period_ms": settings.rate_period_ms,
            "priority": settings.priority,
        }
        self._execute(f"setting queue {settings.name}", self._index_sql.queue_set, arguments)

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None`` if it has none."""
        queue = _check_queue(name)
        self.ensure_open("queue settings")

        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._index_sql.queue_get, (queue,)).fetchone()

        row = self._store.pool.retrying(f"reading queue {queue}", query)
        return None if row is None else _settings_row(row)

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        self.ensure_open("queue settings")

        def query(connection: HubConnection) -> list[tuple[Any, ...]]:
            return connection.execute(self._index_sql.queue_list).fetchall()

        return [_settings_row(row) for row in self._store.pool.retrying("listing queues", query)]

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings (its runs are claimed without limits); ``False`` if it had none."""
        queue = _check_queue(name)
        self.ensure_open("queue settings")

        def query(connection: HubConnection) -> int:
            return connection.execute(self._index_sql.queue_remove, (queue,)).rowcount

        return self._store.pool.retrying(f"removing queue {queue}", query) > 0

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's live leased runs and its starts in the rate window ending at ``now_ms``."""
        queue = _check_queue(name)
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidRecord(f"queue usage now_ms must be an int (wall-clock Unix ms), got {now_ms!r}")
        self.ensure_open("queue usage")

        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._index_sql.queue_usage, {"name": queue, "now": now_ms}).fetchone()

        row = self._store.pool.retrying(f"reading the usage of queue {queue}", query)
        assert row is not None  # two scalar subqueries: always one row
        return QueueUsage(in_progress=int(row[0]), recent_starts=int(row[1]))

    def index_wake(self, run_id: str) -> bool:
        """Set the run's ``wake``, telling listeners if it is claimable now; ``False`` if none or ended."""
        run = self.open_run(run_id, "waking a run")

        def query(connection: HubConnection) -> bool:
            row = connection.execute(self._index_sql.wake, (run,)).fetchone()
            return row is not None and int(row[0]) > 0

        return self._store.pool.retrying(f"waking run {run}", query)

    def listen_wakeups(self) -> PostgresWakeupListener:
        """A dedicated connection that ``LISTEN``s on this schema's wake-up channel."""
        self.ensure_open("listening for wake-ups")
        return PostgresWakeupListener(self._store.settings, self._index_sql.channel)

    def notify_wakeups(self) -> None:
        """``NOTIFY`` every listening worker of this schema that some run became claimable now."""
        self.ensure_open("notifying workers")
        self._execute("notifying workers", self._index_sql.notify, ())

    # -- lifecycle ------------------------------------------------------------------------

    def _close(self) -> None:
        """Release the claimed leases still held, then this journal's hold on the shared connection pool."""
        try:
            with self._leases_lock:
                leases, self._leases = self._leases, None
            if leases is not None:
                leases.close()
        finally:
            self._store.release_user()
