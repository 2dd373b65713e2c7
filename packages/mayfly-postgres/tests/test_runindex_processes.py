"""The run index across processes: racing claimants, workers driving runs, a signal waking a parked run, a crash.

Every check is made from the database (the facts), never from logs.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgserver import IDS, PrivateCluster, drop_schema, with_options

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.errors import JournalUnavailable
from mayfly.reducer import decode_event
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker
from mayfly_postgres import PostgresJournal, PostgresLeaseStore

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def chain(name: str, steps: int) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(steps)
    )
    return WorkflowSpec(workflow_id=f"pgidx.{name}", version=1, nodes=nodes)


APPROVAL = WorkflowSpec(
    workflow_id="pgidx.approval",
    version=1,
    nodes=(
        Node("draft", handler="step@1"),
        Node("approval", handler="approve@1", depends_on=("draft",)),
        Node("ship", handler="step@1", depends_on=("approval",)),
    ),
)


@pytest.fixture
def index_url(server: str) -> Iterator[str]:
    """A schema of this test's own."""
    schema = f"mayfly_pgidx_{uuid.uuid4().hex[:12]}"
    yield with_options(server, schema=schema)
    drop_schema(server, schema)


def child_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def attempts(events: list[Any]) -> dict[str, int]:
    """How many outcomes each attempt id got."""
    outcomes: dict[str, int] = collections.Counter()
    for event in events:
        if type(event).__name__ == "NodeOutcomeCommitted" and event.attempt_id is not None:
            outcomes[event.attempt_id] += 1
    return outcomes


def history(journal: PostgresJournal, run_id: str) -> list[Any]:
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def test_four_claimant_processes_never_get_one_run_twice(index_url: str) -> None:
    """Four processes claim 200 runs in random small batches at once: every run is granted exactly once."""
    runs = [IDS.new_id() for _ in range(200)]
    with PostgresJournal(index_url) as journal:
        journal.index_put(
            [IndexEntry(run_id=run, status=IndexStatus.NEW, ready_at_ms=0, sequence=1) for run in runs]
        )
    processes = [
        subprocess.Popen(
            [sys.executable, str(HERE / "claimant.py"), index_url, f"claimant-{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for n in range(4)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        reports = [process.communicate(timeout=120)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [process.returncode for process in processes] == [0] * 4
    got = {f"claimant-{n}": json.loads(report) for n, report in enumerate(reports)}
    everything = [run for grants in got.values() for run, _ in grants]
    assert sorted(everything) == sorted(runs)  # each run once, none missing
    assert all(token == 1 for grants in got.values() for _, token in grants)
    assert sum(1 for grants in got.values() if grants) >= 2, "one claimant took everything: no race happened"
    with PostgresJournal(index_url) as journal, psycopg.connect(index_url.split("?", maxsplit=1)[0]) as admin:
        rows = admin.execute(
            psycopg.sql.SQL("SELECT run_id::text, owner, token FROM {}.leases").format(
                psycopg.sql.Identifier(journal.schema)
            )
        ).fetchall()
    holders = {run: (owner, token) for run, owner, token in rows}
    for owner, grants in got.items():
        for run, token in grants:
            assert holders[run] == (owner, token)


def test_a_worker_drives_fifty_started_runs_to_success(index_url: str) -> None:
    """50 runs created with WorkflowRuntime.start are claimed and finished by one in-process worker."""
    registry = HandlerRegistry()
    registry.register("step", 1, lambda request: Succeeded(output={"node": request.node_id}))
    starter = WorkflowRuntime(index_url, registry)
    handles = [starter.start(chain("fifty", 3)) for _ in range(50)]
    log: list[dict[str, Any]] = []
    worker = Worker(index_url, registry, concurrency=16, poll_interval_ms=50, log=log.append)
    deadline = time.monotonic() + 120
    worker.run(until=lambda: sum(e["event"] == "ended" for e in log) >= 50 or time.monotonic() > deadline)
    assert [handle.status() for handle in handles] == ["succeeded"] * 50
    assert worker.ended == 50
    with PostgresJournal(index_url) as journal:
        for handle in handles:
            stored = journal.index_get(handle.run_id)
            assert stored is not None and stored.status is IndexStatus.TERMINAL
            assert set(attempts(history(journal, handle.run_id)).values()) == {1}


def _spawn_cli_worker(url: str, tokens: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mayfly",
            "--journal",
            url,
            "worker",
            "--json",
            "--handlers",
            str(HERE / "handlers_pg.py"),
            "--poll-interval",
            "60000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(TEST_TOKENS=str(tokens)),
    )


def test_a_started_run_and_a_signal_from_another_process_wake_an_idle_worker(
    index_url: str, tmp_path: Path
) -> None:
    """With a one-minute poll, start() wakes the worker, it parks the run; `mayfly signal` wakes it and it ships."""
    worker = _spawn_cli_worker(index_url, tmp_path)
    try:
        assert worker.stderr is not None
        assert json.loads(worker.stderr.readline())["event"] == "started"
        time.sleep(0.5)  # polled once; sleeps for a minute unless woken
        runtime = WorkflowRuntime(index_url)
        handle = runtime.start(APPROVAL)
        token_file = tmp_path / handle.run_id
        deadline = time.monotonic() + 20
        while not token_file.exists():
            assert time.monotonic() < deadline, (
                "the started run was not driven: no wake-up reached the worker"
            )
            time.sleep(0.02)
        while json.loads(worker.stderr.readline())["event"] != "parked":
            pass
        sent = time.monotonic()
        signalled = subprocess.run(
            [
                sys.executable,
                "-m",
                "mayfly",
                "--journal",
                index_url,
                "signal",
                handle.run_id,
                "approval",
                "--token",
                token_file.read_text(),
                "--decision",
                "approve",
                "--wait",
                "10",
            ],
            check=False,
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
        )
        assert signalled.returncode == 0, signalled.stderr
        while handle.status() != "succeeded":
            assert time.monotonic() - sent < 20, "the signalled run was not resumed before the poll interval"
            time.sleep(0.02)
        print(f"signal to success: {time.monotonic() - sent:.3f} s (poll interval 60 s)")
        assert runtime.summary(handle.run_id).outputs["approval"]["decision"] == "approve"
    finally:
        worker.terminate()
        worker.communicate(timeout=30)


def _wait_all(url: str, runs: list[str], timeout: float) -> dict[str, str]:
    """Each run's status once none is running (waiting out a restarting server)."""
    deadline = time.monotonic() + timeout
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
                runtime = WorkflowRuntime(journal, leases=leases)
                statuses = {run: runtime.handle(run).status() for run in runs}
        except JournalUnavailable:
            time.sleep(0.2)
            continue
        if all(status not in ("running", "waiting") for status in statuses.values()):
            return statuses
        time.sleep(0.2)
    return statuses


def test_a_server_crash_while_a_worker_claims_a_dead_workers_runs_strands_nothing(
    private_cluster: PrivateCluster,
) -> None:
    """A worker is SIGKILLed; another claims its runs as their leases expire; PostgreSQL crashes; every run ends."""
    schema = f"pgidx_crash_{uuid.uuid4().hex[:8]}"
    url = with_options(private_cluster.url, schema=schema, reconnect_timeout=60)
    with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
        runtime = WorkflowRuntime(journal, leases=leases)
        runs = [runtime.start(chain("crash", 4)).run_id for _ in range(40)]
    env = child_env(TEST_STEP_S="0.5")
    dead = subprocess.Popen(
        [sys.executable, str(HERE / "pgworker.py"), url, "dead", "2000"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert dead.stderr is not None
    dead_claimed: set[str] = set()
    while len(dead_claimed) < 32:
        event = json.loads(dead.stderr.readline())
        if event["event"] == "claimed":
            dead_claimed.add(event["run_id"])
    time.sleep(0.5)  # attempts in flight
    dead.kill()
    _, rest = dead.communicate(timeout=30)
    dead_events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    orphans = dead_claimed - {e["run_id"] for e in dead_events if e["event"] == "ended"}
    survivor = subprocess.Popen(
        [sys.executable, str(HERE / "pgworker.py"), url, "survivor", "2000", "100"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert survivor.stderr is not None
        survivor_claimed: set[str] = set()
        while not survivor_claimed & orphans:
            event = json.loads(survivor.stderr.readline())
            if event["event"] == "claimed":
                survivor_claimed.add(event["run_id"])
        # The survivor has begun claiming the dead worker's runs; some are still the dead worker's.
        with psycopg.connect(private_cluster.url, autocommit=True) as admin:
            row = admin.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {}.leases WHERE owner = 'dead'").format(
                    psycopg.sql.Identifier(schema)
                )
            ).fetchone()
        still_dead = 0 if row is None else int(row[0])
        private_cluster.crash_restart()
        statuses = _wait_all(url, runs, 180)
        assert statuses == {run: "succeeded" for run in runs}
        with PostgresJournal(url) as journal:
            for run in runs:
                events = history(journal, run)
                assert set(attempts(events).values()) == {1}, f"run {run}: an attempt committed twice"
                assert sum(type(e).__name__ == "RunCompleted" for e in events) == 1
    finally:
        survivor.terminate()
        _, log = survivor.communicate(timeout=60)
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    errors = [e["error"] for e in events if e["event"] == "error"]
    assert still_dead > 0, "the survivor had claimed every orphan before the crash: nothing was tested"
    claimed = survivor_claimed | {e["run_id"] for e in events if e["event"] == "claimed"}
    # Every run succeeded (above), so nothing was stranded. An "orphan" the survivor never claimed
    # was presumably finished by the killed worker itself (its last append committed, its `ended` line lost).
    assert claimed & orphans, "the survivor claimed none of the dead worker's runs"
    print(
        f"{len(orphans)} orphaned runs, {still_dead} not yet re-claimed at the crash; "
        f"survivor errors: {len(errors)} {errors[:1]}"
    )


def test_a_role_with_the_documented_grants_and_run_index_drives_runs_through_a_worker(server: str) -> None:
    """The docs page's GRANTs plus the README's run_index GRANT suffice for start() and a worker, no DDL."""
    schema, role = f"mayfly_pgidx_{uuid.uuid4().hex[:12]}", f"mayfly_runtime_{uuid.uuid4().hex[:8]}"
    admin_url = with_options(server, schema=schema)
    PostgresJournal(admin_url).close()  # migrated by the owner
    grants = [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE ON {schema}.runs, {schema}.records, {schema}.snapshots, "
        f"{schema}.leases TO {role}",
        f"GRANT SELECT ON {schema}.mayfly_migrations TO {role}",
        f"GRANT SELECT, INSERT, UPDATE ON {schema}.run_index TO {role}",  # the README's addition
        f"GRANT SELECT, UPDATE ON {schema}.queues TO {role}",  # queue_control (docs page)
        f"GRANT SELECT, UPDATE ON {schema}.schedules TO {role}",  # schedule_store (docs page)
    ]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
        for grant in grants:
            admin.execute(grant.encode())
    host = server.split("://", 1)[1].split("@", 1)[-1]
    role_url = with_options(f"postgresql://{role}@{host}", schema=schema, migrate="never")
    try:
        registry = HandlerRegistry()
        registry.register("step", 1, lambda request: Succeeded())
        handles = [WorkflowRuntime(role_url, registry).start(chain("grants", 2)) for _ in range(3)]
        log: list[dict[str, Any]] = []
        worker = Worker(role_url, registry, poll_interval_ms=50, log=log.append)
        deadline = time.monotonic() + 60
        worker.run(until=lambda: worker.ended >= 3 or time.monotonic() > deadline)
        assert [handle.status() for handle in handles] == ["succeeded"] * 3
        assert [e for e in log if e["event"] == "error"] == []  # the stored schedules were readable too
    finally:
        drop_schema(server, schema)
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role)))
            admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))
