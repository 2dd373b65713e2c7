"""Many runs' snapshots and tails in one statement (the journal's ``run_tails`` feature).

A page of the console's run list (or of ``mayfly runs``) inspects 50 runs;
read one at a time, each costs a snapshot read and a records read, two round
trips per run. :func:`read_tails` reads them all in one statement, so in one
MVCC snapshot: per run one *head* row (its next sequence and its snapshot's
columns, if it has one), then its records from the snapshot's last sequence
on (from 1 without one), in order. The rows come back through the kit's
``window``, so gaps and checksums are checked exactly as ``read`` checks them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psycopg import sql

from mayfly.errors import SnapshotCorrupt
from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly_postgres._pool import HubConnection
from mayfly_postgres._store import Store

__all__ = ["TailStatements", "read_tails"]

Window = Callable[..., list[JournalRecord]]
Decode = Callable[[str, Sequence[Any]], JournalRecord]


class TailStatements:
    """The statement, composed once per schema."""

    def __init__(self, store: Store) -> None:
        # Head rows (kind 0) carry the snapshot; record rows (kind 1) the records. Ordered by the run's
        # text (rows of one run stay together under any collation), then kind, then sequence. Each run's
        # records are a LATERAL range of the records key, ordered (which keeps the subquery from being
        # flattened): a plain join let the planner, on estimates of a freshly filled table, hash every
        # record of the store to keep a page's 400 (seen: a sequential scan of 800,000 records).
        self.read = sql.SQL(
            "WITH heads AS (SELECT w.run_id, COALESCE(r.next_sequence, 1) AS next_sequence, "
            "s.schema_version, s.last_sequence, s.last_event_id, s.last_record_checksum, "
            "s.spec_checksum, s.state_checksum, s.state, s.checksum "
            "FROM unnest(%(runs)s::uuid[]) AS w (run_id) "
            "LEFT JOIN {runs} AS r ON r.run_id = w.run_id LEFT JOIN {snapshots} AS s ON s.run_id = w.run_id) "
            "SELECT h.run_id::text, 0, h.next_sequence, h.schema_version, h.last_sequence, "
            "h.last_event_id::text, h.last_record_checksum, h.spec_checksum, h.state_checksum, h.state, "
            "h.checksum, NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::bytea, NULL::text "
            "FROM heads AS h "
            "UNION ALL SELECT h.run_id::text, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, c.* "
            "FROM heads AS h CROSS JOIN LATERAL (SELECT sequence, event_id::text, event_type, "
            "schema_version, payload, checksum FROM {records} WHERE run_id = h.run_id "
            "AND sequence >= COALESCE(h.last_sequence, 1) ORDER BY sequence) AS c "
            "ORDER BY 1, 2, 12"
        ).format(runs=store.table("runs"), snapshots=store.table("snapshots"), records=store.table("records"))


def read_tails(
    store: Store, statements: TailStatements, runs: tuple[str, ...], window: Window, decode: Decode
) -> list[tuple[SnapshotRecord | SnapshotCorrupt | None, list[JournalRecord]]]:
    """For each run (in order): its stored snapshot (unverified) and its records from the snapshot on.

    ``window`` is the journal's ``JournalBase.window`` and ``decode(run,
    columns)`` turns a record row into a verified record.
    """

    def query(connection: HubConnection) -> list[tuple[Any, ...]]:
        return connection.execute(statements.read, {"runs": list(runs)}).fetchall()

    rows = store.pool.retrying(f"reading {len(runs)} runs' tails", query)
    heads: dict[str, tuple[int, SnapshotRecord | None]] = {}
    records: dict[str, list[tuple[int, Sequence[Any]]]] = {run: [] for run in runs}
    for row in rows:
        run = row[0]
        if row[1] == 0:
            heads[run] = (int(row[2]), _snapshot(run, row[3:11]))
        else:
            columns = row[11:]
            records[run].append((int(columns[0]), columns))
    found: list[tuple[SnapshotRecord | SnapshotCorrupt | None, list[JournalRecord]]] = []
    for run in runs:
        head, snapshot = heads[run]
        after = 0 if snapshot is None else max(0, snapshot.last_sequence - 1)
        read = window(
            run,
            after,
            None,
            records[run],
            lambda _, columns, run=run: decode(run, columns),
            next_sequence=head,
        )
        found.append((snapshot, read))
    return found


def _snapshot(run: str, columns: Sequence[Any]) -> SnapshotRecord | None:
    """The snapshot a head row holds (``None`` when the run has none), as stored: the kit verifies it."""
    version, last_sequence, last_event, last_checksum, spec, state_checksum, state, checksum = columns
    if version is None:
        return None
    return SnapshotRecord(
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
