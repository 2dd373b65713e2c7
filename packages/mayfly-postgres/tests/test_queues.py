"""Queue flow control on PostgreSQL beyond the contract: the upgrade from migration 2, dedup races, expiring leases.

The contract suite (``queues.*``) certifies the feature; these tests cover what
only this backend has: a store at migration 2 upgraded in place with its rows,
two connections creating the same dedup id at once (the partial unique index
decides), and the concurrency limit held, on the server's clock, by four
processes claiming with leases that keep expiring.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgserver import IDS, batch, drop_schema, with_options
from psycopg import sql

from mayfly.errors import DuplicateRun
from mayfly.queues import QUEUE_CONTROL, QueueSettings, QueueUsage
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_postgres import PostgresJournal
from mayfly_postgres._schema import LATEST_VERSION, MIGRATIONS, applied_version

HERE = Path(__file__).resolve().parent
SECONDS = 3


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def queue_url(server: str) -> Iterator[str]:
    """A schema of this test's own."""
    schema = f"mayfly_pgq_{uuid.uuid4().hex[:12]}"
    yield with_options(server, schema=schema)
    drop_schema(server, schema)


def _created(run: str, queue: str, dedup: str | None) -> Callable[[], IndexEntry]:
    """The entry of a run's creation batch (``batch(run, 1)``: sequences 1..3)."""
    return lambda: IndexEntry(
        run_id=run, queue=queue, status=IndexStatus.NEW, ready_at_ms=_now_ms(), sequence=3, dedup_id=dedup
    )


def test_a_store_at_migration_2_is_upgraded_in_place_with_its_rows(queue_url: str, server: str) -> None:
    """Migration 3 keeps migration 2's entries (no dedup id, no start), and claims then limit and record them."""
    with PostgresJournal(queue_url) as journal:
        schema = journal.schema
    name = sql.Identifier(schema)
    queue = "upgraded"
    live, new, ended = IDS.new_id(), IDS.new_id(), IDS.new_id()
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(name))
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(name))
        admin.execute(
            sql.SQL(
                "CREATE TABLE {}.mayfly_migrations (version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(name)
        )
        for version, description, statements in MIGRATIONS[:2]:
            for template in statements:
                admin.execute(sql.SQL(template).format(schema=name))
            admin.execute(
                sql.SQL("INSERT INTO {}.mayfly_migrations (version, description) VALUES (%s, %s)").format(
                    name
                ),
                (version, description),
            )
        # Migration 2's rows: a running run leased live, a new run, an ended run.
        admin.execute(
            sql.SQL(
                "INSERT INTO {}.run_index (run_id, queue, status, ready_at, sequence) VALUES "
                "(%s, %s, 'running', 1, 5), (%s, %s, 'new', 2, 3), (%s, %s, 'terminal', NULL, 9)"
            ).format(name),
            (live, queue, new, queue, ended, queue),
        )
        admin.execute(
            sql.SQL(
                "INSERT INTO {}.leases (run_id, owner, token, grant_id, expires_at) "
                "VALUES (%s, 'old-worker', 4, gen_random_uuid(), now() + interval '1 hour')"
            ).format(name),
            (live,),
        )
        admin.execute(sql.SQL("INSERT INTO {}.runs (run_id, fence) VALUES (%s, 4)").format(name), (live,))
        assert applied_version(admin, schema) == 2
    with PostgresJournal(queue_url) as journal:
        with psycopg.connect(server, autocommit=True) as admin:
            assert applied_version(admin, schema) == LATEST_VERSION >= 3
        assert journal.index_get(new) == IndexEntry(
            run_id=new, queue=queue, status=IndexStatus.NEW, ready_at_ms=2, sequence=3
        )
        control = QUEUE_CONTROL.of(journal)
        assert control is not None
        assert control.queue_list() == []
        control.queue_set(QueueSettings(name=queue, concurrency=1))
        # The old worker's live lease counts: no room for the new run.
        assert control.queue_usage(queue, now_ms=_now_ms()) == QueueUsage(in_progress=1, recent_starts=0)
        assert journal.claim("w", limit=5, ttl_ms=30_000, now_ms=_now_ms(), queues=[queue]) == []
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(sql.SQL("UPDATE {}.leases SET expires_at = '-infinity'").format(name))
        now = _now_ms()
        guards = journal.claim("w", limit=5, ttl_ms=30_000, now_ms=now, queues=[queue])
        assert [guard.run_id for guard in guards] == [live]
        assert guards[0].fencing_token == 5
        stored = journal.index_get(live)
        assert stored is not None and stored.started_ms is None, "a running run's claim is no start"
        guards[0].release()
        control.queue_set(QueueSettings(name=queue, concurrency=2))
        assert sorted(g.run_id for g in journal.claim("w", limit=5, ttl_ms=30_000, now_ms=now)) == sorted(
            [live, new]
        )
        stored = journal.index_get(new)
        assert stored is not None and stored.started_ms == now, "the new run's first claim is its start"
        # Dedup ids work on the upgraded table.
        first, second = IDS.new_id(), IDS.new_id()
        journal.append_indexed(first, 1, batch(first, 1), None, _created(first, queue, "order-1"))
        with pytest.raises(DuplicateRun) as refused:
            journal.append_indexed(second, 1, batch(second, 1), None, _created(second, queue, "order-1"))
        assert refused.value.live_run_id == first
        assert journal.next_sequence(second) == 1 and journal.index_get(second) is None


def test_a_dedup_id_held_by_an_uncommitted_creation_decides_when_that_commits(
    queue_url: str, server: str
) -> None:
    """An append waits on another transaction's uncommitted entry with its dedup id: refused if it commits."""
    with PostgresJournal(queue_url) as journal:
        name = sql.Identifier(journal.schema)
        for commit in (True, False):
            dedup, other, mine = f"job-{uuid.uuid4().hex[:6]}", IDS.new_id(), IDS.new_id()
            outcome: list[object] = []

            def append(run: str = mine, dedup: str = dedup, outcome: list[object] = outcome) -> None:
                try:
                    outcome.append(
                        journal.append_indexed(run, 1, batch(run, 1), None, _created(run, "q", dedup))
                    )
                except BaseException as exc:  # reported to the test thread
                    outcome.append(exc)

            with psycopg.connect(server) as blocker, psycopg.connect(server, autocommit=True) as admin:
                blocker.execute(
                    sql.SQL(
                        "INSERT INTO {}.run_index (run_id, queue, status, ready_at, sequence, dedup_id) "
                        "VALUES (%s, 'q', 'new', 0, 3, %s)"
                    ).format(name),
                    (other, dedup),
                )
                thread = threading.Thread(target=append)
                thread.start()
                deadline = time.monotonic() + 10
                while not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    (f"%{journal.schema}%run_index%",),
                ).fetchall():
                    assert time.monotonic() < deadline, "the append never waited on the uncommitted entry"
                    time.sleep(0.02)
                if commit:
                    blocker.commit()
                else:
                    blocker.rollback()
                thread.join(timeout=30)
            assert len(outcome) == 1
            if commit:
                assert isinstance(outcome[0], DuplicateRun) and outcome[0].live_run_id == other
                assert journal.next_sequence(mine) == 1 and journal.index_get(mine) is None
            else:
                assert not isinstance(outcome[0], BaseException), outcome[0]
                stored = journal.index_get(mine)
                assert stored is not None and stored.dedup_id == dedup


def test_two_connections_creating_one_dedup_id_at_once_exactly_one_wins(queue_url: str) -> None:
    """Two threads (two pooled connections) append creations with the same dedup id, 10 rounds: one wins each."""
    with PostgresJournal(queue_url) as journal:
        for _ in range(10):
            dedup = f"pay-{uuid.uuid4().hex[:6]}"
            runs = [IDS.new_id(), IDS.new_id()]
            start = threading.Barrier(2)
            outcomes: dict[str, object] = {}

            def create(
                run: str,
                dedup: str = dedup,
                start: threading.Barrier = start,
                outcomes: dict[str, object] = outcomes,
            ) -> None:
                records = batch(run, 1)
                start.wait(timeout=10)
                try:
                    journal.append_indexed(run, 1, records, None, _created(run, "pay", dedup))
                    outcomes[run] = "created"
                except DuplicateRun as exc:
                    outcomes[run] = exc

            threads = [threading.Thread(target=create, args=(run,)) for run in runs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            winners = [run for run in runs if outcomes.get(run) == "created"]
            assert len(winners) == 1, outcomes
            loser = runs[1 - runs.index(winners[0])]
            refused = outcomes[loser]
            assert isinstance(refused, DuplicateRun) and refused.live_run_id == winners[0]
            assert journal.next_sequence(loser) == 1 and journal.index_get(loser) is None


def _audit(server: str, schema: str) -> None:
    """Log every lease grant (insert, or update that changes the token) with its expiry, by trigger."""
    name = sql.Identifier(schema)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE TABLE {}.grant_log (run_id uuid, token bigint, expires_at timestamptz)").format(
                name
            )
        )
        admin.execute(
            sql.SQL(
                "CREATE FUNCTION {}.log_grant() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "INSERT INTO {}.grant_log VALUES (NEW.run_id, NEW.token, NEW.expires_at); RETURN NEW; END $$"
            ).format(name, name)
        )
        admin.execute(
            sql.SQL(
                "CREATE TRIGGER grant_logged AFTER INSERT ON {}.leases FOR EACH ROW "
                "EXECUTE FUNCTION {}.log_grant()"
            ).format(name, name)
        )
        admin.execute(
            sql.SQL(
                "CREATE TRIGGER regrant_logged AFTER UPDATE ON {}.leases FOR EACH ROW "
                "WHEN (OLD.token IS DISTINCT FROM NEW.token) EXECUTE FUNCTION {}.log_grant()"
            ).format(name, name)
        )


def test_four_processes_with_expiring_leases_never_exceed_the_concurrency(
    queue_url: str, server: str
) -> None:
    """Concurrency 2, leases of 250 ms left to expire, 4 processes claiming for 3 s: never 3 live at once."""
    ttl_ms, queue = 250, "limited"
    with PostgresJournal(queue_url) as journal:
        schema = journal.schema
        control = QUEUE_CONTROL.of(journal)
        assert control is not None
        control.queue_set(QueueSettings(name=queue, concurrency=2))
        journal.index_put(
            [
                IndexEntry(
                    run_id=IDS.new_id(), queue=queue, status=IndexStatus.RUNNING, ready_at_ms=n, sequence=1
                )
                for n in range(10)
            ]
        )
    _audit(server, schema)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "queue_claimant.py"),
                queue_url,
                f"racer-{n}",
                queue,
                str(SECONDS),
                str(ttl_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        # Meanwhile new runs of rising priority arrive, each first in claim order: claimants whose
        # snapshots differ by one arrival plan different runs, so a claim counting leases in a snapshot
        # older than another claim's commit would exceed the limit.
        name = sql.Identifier(schema)
        with psycopg.connect(server, autocommit=True) as admin:
            deadline, priority = time.monotonic() + SECONDS, 1
            while time.monotonic() < deadline:
                admin.execute(
                    sql.SQL(
                        "INSERT INTO {}.run_index (run_id, queue, status, ready_at, sequence, priority) "
                        "VALUES (%s, %s, 'running', 0, 1, %s)"
                    ).format(name),
                    (IDS.new_id(), queue, priority),
                )
                priority += 1
                time.sleep(0.003)
        reports: list[list[Any]] = []
        for child in children:
            assert child.stdout is not None
            reports.append(json.loads(child.stdout.readline()))
            assert child.wait(timeout=60) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    with psycopg.connect(server, autocommit=True) as admin:
        rows = admin.execute(
            sql.SQL(
                "SELECT run_id::text, token, expires_at - %s::float8 * interval '1 millisecond', expires_at "
                "FROM {}.grant_log"
            ).format(sql.Identifier(schema)),
            (float(ttl_ms),),
        ).fetchall()
    granted = {(run, token) for report in reports for run, token in report}
    assert granted == {(str(run), int(token)) for run, token, _, _ in rows}, "every grant was logged"
    # Live leases at each grant's start, on the server's clock (a lease ends when it expires).
    most = max(sum(1 for _, _, start, end in rows if start <= at < end) for _, _, at, _ in rows)
    assert most == 2, f"{most} leases of the queue were live at once under concurrency 2"
    assert len(rows) > 8, f"only {len(rows)} grants in 3 s: the leases did not expire and get re-granted"
    assert sum(1 for report in reports if report) >= 2, f"the processes did not race: {reports}"


def test_an_index_put_of_a_second_live_dedup_id_is_refused_and_writes_nothing(queue_url: str) -> None:
    """index_put of entries one of which repeats a live run's dedup id raises DuplicateRun; no entry is written."""
    with PostgresJournal(queue_url) as journal:
        live, other, fresh = IDS.new_id(), IDS.new_id(), IDS.new_id()
        journal.index_put(
            [
                IndexEntry(
                    run_id=live, queue="q", status=IndexStatus.NEW, ready_at_ms=1, sequence=1, dedup_id="d"
                )
            ]
        )
        clash = IndexEntry(
            run_id=other, queue="q", status=IndexStatus.NEW, ready_at_ms=2, sequence=1, dedup_id="d"
        )
        unrelated = IndexEntry(run_id=fresh, queue="q", status=IndexStatus.NEW, ready_at_ms=3, sequence=1)
        with pytest.raises(DuplicateRun) as refused:
            journal.index_put([unrelated, clash])
        assert (refused.value.run_id, refused.value.live_run_id) == (other, live)
        assert journal.index_get(other) is None and journal.index_get(fresh) is None
        # Once the holder ended, the id is free.
        journal.index_put(
            [
                IndexEntry(
                    run_id=live,
                    queue="q",
                    status=IndexStatus.TERMINAL,
                    ready_at_ms=None,
                    sequence=2,
                    dedup_id="d",
                )
            ]
        )
        journal.index_put([unrelated, clash])
        assert journal.index_get(other) == clash
