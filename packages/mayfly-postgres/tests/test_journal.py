"""PostgresJournal beyond the contract suite: ambiguous commits, cooperative waits, durability, inspection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from pgserver import IDS, Proxy, batch, fresh_schema, with_options

from mayfly.journal import Durability, JournalRecord
from mayfly.model.errors import ChecksumMismatch, CorruptionError, JournalGap, JournalUnavailable
from mayfly.substrate import Hub, sleep, spawn
from mayfly_postgres import PostgresJournal


@pytest.fixture
def proxied(server: str, schema: str, request: pytest.FixtureRequest) -> Iterator[tuple[Proxy, str]]:
    """A proxy cutting the first append statement (mode from the test's parameter) and its journal URL."""
    marker, mode = request.param
    proxy = Proxy(server, marker, mode)
    try:
        yield proxy, with_options(proxy.url, schema=schema, pool_size=1)
    finally:
        proxy.close()


@pytest.mark.parametrize("proxied", [("WITH bump AS", "after")], indirect=True)
def test_commit_whose_reply_is_lost_is_read_back_and_acknowledged_once(
    proxied: tuple[Proxy, str], journal: PostgresJournal
) -> None:
    """The server commits but the connection drops before the reply: the append succeeds, stored once."""
    proxy, url = proxied
    run = IDS.new_id()
    records = batch(run, 1)
    with PostgresJournal(url) as through_proxy:
        result = through_proxy.append(run, 1, records)
    assert proxy.dropped()
    assert not result.already_committed and result.last_sequence == 3
    assert journal.read(run) == records
    assert journal.next_sequence(run) == 4


@pytest.mark.parametrize("proxied", [("WITH bump AS", "before")], indirect=True)
def test_statement_lost_before_the_server_is_retried_and_committed_once(
    proxied: tuple[Proxy, str], journal: PostgresJournal
) -> None:
    """The connection drops before the statement reaches the server: the append is retried, stored once."""
    proxy, url = proxied
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 1))
    records = batch(run, 2)
    with PostgresJournal(url) as through_proxy:
        result = through_proxy.append(run, 2, records)
    assert proxy.dropped()
    assert result.records == tuple(records)
    assert journal.read(run, after=1) == records
    assert journal.next_sequence(run) == 5


def test_terminated_backend_mid_append_never_duplicates(url: str, server: str) -> None:
    """Backends killed with pg_terminate_backend around appends: every acknowledged batch is stored once."""
    run = IDS.new_id()
    acknowledged: list[JournalRecord] = []
    with (
        PostgresJournal(with_options(url, application_name="mayfly_terminate_probe")) as journal,
        psycopg.connect(server, autocommit=True) as killer,
    ):
        for round_ in range(30):
            records = batch(run, len(acknowledged) + 1)
            if round_ % 3 == 0:
                killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'mayfly_terminate_probe'"
                )
            result = journal.append(run, len(acknowledged) + 1, records)
            acknowledged.extend(result.records)
        stored = journal.read(run)
    assert stored == acknowledged
    assert len({r.event_id for r in stored}) == len(stored) == 90


def test_append_waiting_on_a_row_lock_lets_hub_timers_run(journal: PostgresJournal, server: str) -> None:
    """While an append waits on the server (row locked elsewhere), other hub tasks keep running."""
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 1))
    ticks: list[str] = []
    blocker = psycopg.connect(server)
    blocker.execute(
        psycopg.sql.SQL("SELECT 1 FROM {} WHERE run_id = %s FOR UPDATE").format(
            psycopg.sql.Identifier(journal.schema, "runs")
        ),
        (run,),
    )

    def append() -> None:
        journal.append(run, 2, batch(run, 2))
        ticks.append("appended")

    def ticker() -> None:
        for _ in range(10):
            sleep(0.01)
            ticks.append("tick")
        blocker.commit()  # lets the parked append through

    def main() -> None:
        first = spawn(append)
        second = spawn(ticker)
        first.join()
        second.join()

    try:
        Hub().run(main)
    finally:
        blocker.close()
    assert ticks == ["tick"] * 10 + ["appended"]
    assert journal.next_sequence(run) == 5


def test_many_tasks_share_a_small_pool(url: str) -> None:
    """Twenty hub tasks appending to their own runs through a pool of two connections all succeed."""
    runs = [IDS.new_id() for _ in range(20)]
    with PostgresJournal(with_options(url, pool_size=2, application_name="mayfly_pool2")) as journal:

        def work(run: str) -> int:
            for first in (1, 4, 7):
                journal.append(run, first, batch(run, first))
            return journal.next_sequence(run)

        def main() -> list[Any]:
            tasks = [spawn(work, run) for run in runs]
            return [task.join() for task in tasks]

        assert Hub().run(main) == [10] * 20


def test_durable_mode_forces_synchronous_commit_on(server: str, schema: str) -> None:
    """durability=durable connects with synchronous_commit=on even if the URL's options ask for off; other options stay."""
    url = with_options(
        server, schema=schema, options="-c%20synchronous_commit%3Doff%20-c%20statement_timeout%3D12345"
    )
    with PostgresJournal(url) as journal:
        assert journal.durability is Durability.DURABLE
        with journal._store.pool.connection() as connection:
            assert connection.execute("SHOW synchronous_commit").fetchone() == ("on",)
            assert connection.execute("SHOW statement_timeout").fetchone() == ("12345ms",)


def test_write_mode_declares_write_and_commits_asynchronously(url: str) -> None:
    """durability=write declares Durability.WRITE and its connections run synchronous_commit=off."""
    with PostgresJournal(with_options(url, durability="write")) as journal:
        assert journal.durability is Durability.WRITE
        assert journal.capabilities.durability is Durability.WRITE
        with journal._store.pool.connection() as connection:
            assert connection.execute("SHOW synchronous_commit").fetchone() == ("off",)
        run = IDS.new_id()
        journal.append(run, 1, batch(run, 1))
        assert journal.next_sequence(run) == 4


def test_unreachable_server_is_journal_unavailable(schema: str) -> None:
    """A server that is not there raises JournalUnavailable (one line, no driver exception)."""
    with pytest.raises(JournalUnavailable) as caught:
        PostgresJournal(f"postgresql://postgres@127.0.0.1:1/test?schema={schema}&reconnect_timeout=0")
    assert "\n" not in str(caught.value)
    assert caught.value.__cause__ is None


def test_unknown_database_is_journal_unavailable(server: str, schema: str) -> None:
    """A database that does not exist is a permanent JournalUnavailable naming the problem."""
    parts = urlsplit(server)
    missing = parts._replace(path="/mayfly_no_such_database").geturl()
    with pytest.raises(JournalUnavailable, match="mayfly_no_such_database"):
        PostgresJournal(with_options(missing, schema=schema))


def test_inspection_index_tracks_workflow_and_status(url: str) -> None:
    """Runs driven by the runtime appear in run_summaries with their workflow id and final status."""
    import mayfly
    from mayfly import HandlerRegistry, Node, Succeeded, WorkflowRuntime, WorkflowSpec
    from mayfly_postgres import PostgresLeaseStore

    workflow = f"pg.inspect.w{IDS.new_id()[-8:]}"
    registry = HandlerRegistry()
    registry.register("ok", 1, lambda request: Succeeded(output=1), cooperative=True)
    spec = WorkflowSpec(workflow_id=workflow, version=1, nodes=(Node("a", handler="ok@1"),))
    with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
        runtime = WorkflowRuntime(journal, registry, leases=leases)
        results = [runtime.execute(spec) for _ in range(3)]
        assert all(result.status is mayfly.RunStatus.SUCCEEDED for result in results)
        summaries = journal.run_summaries(workflow_id=workflow)
        assert sorted(s.run_id for s in summaries) == sorted(r.run_id for r in results)
        assert {(s.workflow_id, s.status) for s in summaries} == {(workflow, "succeeded")}
        assert all(
            s.last_sequence == r.sequence
            for s, r in zip(
                sorted(summaries, key=lambda s: s.run_id),
                sorted(results, key=lambda r: r.run_id),
                strict=True,
            )
        )
        newest_first = journal.run_summaries(status="succeeded", limit=2)
        assert len(newest_first) == 2 and newest_first[0].updated_at >= newest_first[1].updated_at
        older = journal.run_summaries(status="succeeded", updated_before=newest_first[-1].updated_at)
        assert all(s.updated_at < newest_first[-1].updated_at for s in older)


def test_listing_queries_use_indexes_with_100k_runs(server: str) -> None:
    """With 100k runs, run listing and every run_summaries filter are index scans (no sequential scan)."""
    schema = fresh_schema()
    url = with_options(server, schema=schema)
    try:
        with PostgresJournal(url) as journal, journal._store.pool.connection() as connection:
            runs = psycopg.sql.Identifier(schema, "runs")
            connection.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {} (run_id, next_sequence, workflow_id, status, updated_at) "
                    "SELECT gen_random_uuid(), 1 + i % 50, 'wf.' || (i % 100), "
                    "(ARRAY['running','succeeded','failed','cancelled'])[1 + i % 4], "
                    "now() - i * interval '1 second' FROM generate_series(1, 100000) AS i"
                ).format(runs)
            )
            connection.execute(psycopg.sql.SQL("ANALYZE {}").format(runs))
            sql = journal._sql
            plans = {
                "list_runs": (sql.list_first, (1000,)),
                "list_runs after": (sql.list_after, ("80000000-0000-0000-0000-000000000000", 1000)),
                "by status": (
                    sql.summaries.format(runs=runs, filters=psycopg.sql.SQL("AND status = %s")),
                    ("failed", 100),
                ),
                "by workflow": (
                    sql.summaries.format(runs=runs, filters=psycopg.sql.SQL("AND workflow_id = %s")),
                    ("wf.7", 100),
                ),
                "newest": (sql.summaries.format(runs=runs, filters=psycopg.sql.SQL("")), (100,)),
            }
            for name, (statement, arguments) in plans.items():
                plan = "\n".join(
                    row[0] for row in connection.execute(psycopg.sql.SQL("EXPLAIN ") + statement, arguments)
                )
                assert "Index" in plan and "Seq Scan" not in plan, f"{name}:\n{plan}"
            assert len(journal.list_runs(limit=1000)) == 1000
            assert len(journal.run_summaries(status="failed", limit=100)) == 100
    finally:
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(
                psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(schema))
            )


def test_records_table_disagreeing_with_the_run_row_fails_closed(
    journal: PostgresJournal, server: str
) -> None:
    """A stray record beyond runs.next_sequence makes the append raise CorruptionError, not loop or overwrite."""
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 1))
    stray = batch(run, 2, 1)[0]
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (run_id, sequence, event_id, event_type, schema_version, payload, checksum) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)"
            ).format(psycopg.sql.Identifier(journal.schema, "records")),
            (run, 2, stray.event_id, stray.event_type, 1, stray.payload, stray.checksum),
        )
    with pytest.raises(CorruptionError, match="disagree"):
        journal.append(run, 2, batch(run, 2))
    assert journal.next_sequence(run) == 2


def test_backend_terminated_mid_statement_is_resolved_and_committed_once(url: str, server: str) -> None:
    """pg_terminate_backend on an append waiting inside the server: read back, retried, stored once."""
    name = f"mayfly_victim_{IDS.new_id()[-12:]}"
    run = IDS.new_id()
    records = batch(run, 2)
    with PostgresJournal(with_options(url, application_name=name)) as journal:
        journal.append(run, 1, batch(run, 1, 1))
        blocker = psycopg.connect(server)
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {} WHERE run_id = %s FOR UPDATE").format(
                psycopg.sql.Identifier(journal.schema, "runs")
            ),
            (run,),
        )
        terminated: list[int] = []

        def append() -> Any:
            return journal.append(run, 2, records)

        def terminate() -> None:
            with psycopg.connect(server, autocommit=True) as killer:
                while not terminated:
                    sleep(0.01)
                    # The append's backend is waiting for the row lock: the statement is in flight.
                    rows = killer.execute(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                        "WHERE application_name = %s AND wait_event_type = 'Lock'",
                        (name,),
                    ).fetchall()
                    terminated.extend(1 for row in rows if row[0])
            blocker.commit()

        def main() -> Any:
            appender, killer = spawn(append), spawn(terminate)
            killer.join()
            return appender.join()

        try:
            result = Hub().run(main)
        finally:
            blocker.close()
        assert terminated and not result.already_committed
        assert journal.read(run, after=1) == records
        assert journal.next_sequence(run) == 5


def test_read_only_server_is_retried_then_unavailable(url: str) -> None:
    """A server refusing writes (read-only, as a demoted primary) is retried, then JournalUnavailable; nothing written."""
    read_only = with_options(url, reconnect_timeout=0.5, options="-c%20default_transaction_read_only%3Don")
    run = IDS.new_id()
    with PostgresJournal(read_only) as journal:
        with pytest.raises(JournalUnavailable, match="25006"):
            journal.append(run, 1, batch(run, 1))
        assert journal.next_sequence(run) == 1


def _records_sql(journal: PostgresJournal, statement: str) -> psycopg.sql.Composed:
    return psycopg.sql.SQL(statement).format(records=psycopg.sql.Identifier(journal.schema, "records"))


# Each damage rewrites stored columns of sequence 3 of a five-record run directly, as an operator,
# a bad restore or a disk could; %(run)s is the run, %(other)s another run of the same schema.
DAMAGE = {
    "payload": [
        "UPDATE {records} SET payload = payload || ' '::bytea WHERE run_id = %(run)s AND sequence = 3"
    ],
    "payload-not-utf8": [
        "UPDATE {records} SET payload = '\\xff'::bytea WHERE run_id = %(run)s AND sequence = 3"
    ],
    "event-id": ["UPDATE {records} SET event_id = gen_random_uuid() WHERE run_id = %(run)s AND sequence = 3"],
    "event-type": ["UPDATE {records} SET event_type = 'Forged' WHERE run_id = %(run)s AND sequence = 3"],
    "event-type-invalid": [
        "UPDATE {records} SET event_type = 'no such type!' WHERE run_id = %(run)s AND sequence = 3"
    ],
    "schema-version": [
        "UPDATE {records} SET schema_version = schema_version + 1 WHERE run_id = %(run)s AND sequence = 3"
    ],
    "checksum": ["UPDATE {records} SET checksum = repeat('0', 64) WHERE run_id = %(run)s AND sequence = 3"],
    "checksum-garbage": ["UPDATE {records} SET checksum = 'x' WHERE run_id = %(run)s AND sequence = 3"],
    "cut-and-renumbered": [
        "DELETE FROM {records} WHERE run_id = %(run)s AND sequence = 3",
        "UPDATE {records} SET sequence = sequence - 1 WHERE run_id = %(run)s AND sequence > 3",
    ],
    "swapped": [
        "UPDATE {records} SET sequence = 100 WHERE run_id = %(run)s AND sequence = 3",
        "UPDATE {records} SET sequence = 3 WHERE run_id = %(run)s AND sequence = 4",
        "UPDATE {records} SET sequence = 4 WHERE run_id = %(run)s AND sequence = 100",
    ],
    "moved-from-another-run": [
        "DELETE FROM {records} WHERE run_id = %(run)s AND sequence = 3",
        "UPDATE {records} SET run_id = %(run)s WHERE run_id = %(other)s AND sequence = 3",
    ],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_row_changed_in_place_fails_closed_on_every_read_path(
    journal: PostgresJournal, server: str, damage: str
) -> None:
    """Rewriting any stored column of a record raises ChecksumMismatch naming run and sequence, on reads and re-appends."""
    run, other = IDS.new_id(), IDS.new_id()
    records = batch(run, 1, 5)
    journal.append(run, 1, records)
    journal.append(other, 1, batch(other, 1, 5))
    with psycopg.connect(server, autocommit=True) as connection:
        for statement in DAMAGE[damage]:
            connection.execute(_records_sql(journal, statement), {"run": run, "other": other})
    located = rf"run {run} sequence 3\b"
    with pytest.raises(ChecksumMismatch, match=located):
        journal.read(run)
    with pytest.raises(ChecksumMismatch, match=located):
        journal.read(run, after=2, limit=1)  # the lookup of a snapshot's last record
    with pytest.raises(ChecksumMismatch, match=located):
        journal.append(run, 1, records)  # an exact re-append must not pass for committed
    assert journal.read(run, limit=2) == records[:2]


def test_a_missing_record_is_reported_where_it_is(journal: PostgresJournal) -> None:
    """Record 4 of 9 removed: the gap is reported as expected sequence 4, found 5."""
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 9))
    journal.remove_record(run, 4)
    with pytest.raises(JournalGap, match=rf"^journal gap in run {run}: expected sequence 4, found 5; "):
        journal.read(run)
    with pytest.raises(JournalGap, match="expected sequence 4, found 5"):
        journal.read(run, after=3, limit=1)
    assert [r.sequence for r in journal.read(run, limit=3)] == [1, 2, 3]


def test_a_missing_last_record_is_a_gap_not_a_shorter_history(journal: PostgresJournal) -> None:
    """Record 9 of 9 removed: reads raise JournalGap at sequence 9 against runs.next_sequence, never return 8."""
    run = IDS.new_id()
    records = batch(run, 1, 9)
    journal.append(run, 1, records)
    journal.remove_record(run, 9)
    tail = rf"^journal gap in run {run}: expected sequence 9, found none \(the run's head is at 10\); "
    with pytest.raises(JournalGap, match=tail):
        journal.read(run)
    with pytest.raises(JournalGap, match=tail):
        journal.read(run, after=8)
    with pytest.raises(JournalGap, match=tail):
        journal.read(run, after=7, limit=5)
    assert journal.read(run, after=5, limit=3) == records[5:8]
    assert journal.read(run, after=9) == []
