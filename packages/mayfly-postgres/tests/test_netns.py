"""Hosts, not just processes: PostgreSQL workers in network namespaces, partitioned and killed.

Each worker is a real :class:`mayfly.worker.Worker` process (``python -m mayfly_contract._nsworker``)
in a namespace of its own, reaching a PostgreSQL cluster of this session's own
only through a veth pair and a bridge (:mod:`mayfly_contract.hosts`). A partition is the
worker's link going down: its packets are lost, its connections stay open and
come back when the link does. Every verdict is read from the journal; the
workers' JSON logs only say when to look.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgserver import PrivateCluster, drop_schema, with_options

from mayfly import Node, WorkflowSpec
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted, RunCompleted
from mayfly.reducer import decode_event
from mayfly.runindex import IndexStatus
from mayfly.runtime import WorkflowRuntime
from mayfly_contract.hosts import Hosts, netns_problem, remove_stale
from mayfly_postgres import PostgresJournal, PostgresLeaseStore

HERE = Path(__file__).parent
TTL_MS = 2_000
POLL_MS = 200


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    """Three namespaces on a bridge; a skip naming the reason where they cannot be made (never in CI)."""
    problem = netns_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"network namespaces are required in CI: {problem}", pytrace=False)
        pytest.skip(f"network namespaces unavailable: {problem}")
    remove_stale()
    made = Hosts(3)
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture(scope="session")
def bridged_server(hosts: Hosts, cluster_binaries: None) -> Iterator[str]:
    """A private cluster listening on the bridge address, trusting the namespaces' subnet."""
    config = Path(tempfile.mkdtemp(prefix="mayfly-pg-hba-"))
    config.chmod(0o755)
    hba = config / "pg_hba.conf"
    hba.write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        f"host all all {hosts.subnet.with_prefixlen} trust\n"
    )
    hba.chmod(0o644)
    # Its files in memory where the machine has /dev/shm: fsync stays on, but costs little on a loaded
    # machine (these tests crash no server; they check fencing and recovery over 1,600 commits).
    saved = tempfile.tempdir
    tempfile.tempdir = "/dev/shm" if os.path.isdir("/dev/shm") else saved
    try:
        cluster = PrivateCluster(f"listen_addresses=127.0.0.1,{hosts.gateway}", f"hba_file={hba}")
    finally:
        tempfile.tempdir = saved
    try:
        yield f"postgresql://postgres@{hosts.gateway}:{cluster.port}/postgres"
    finally:
        cluster.destroy()
        hba.unlink()
        config.rmdir()


@pytest.fixture
def url(bridged_server: str) -> Iterator[str]:
    """A schema of this test's own; workers keep retrying a lost server for two minutes."""
    schema = f"mayfly_netns_{uuid.uuid4().hex[:12]}"
    yield with_options(bridged_server, schema=schema, reconnect_timeout=120)
    drop_schema(bridged_server, schema)


class WorkerProcess:
    """A worker in a namespace, its JSON events written to a file the test reads back."""

    def __init__(self, hosts: Hosts, n: int, url: str, owner: str, log: Path, *, step_s: float, slots: int):
        self.owner = owner
        self.log = log
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
            "TEST_STEP_S": str(step_s),
        }
        argv = [
            sys.executable,
            "-m",
            "mayfly_contract._nsworker",
            url,
            owner,
            str(TTL_MS),
            str(POLL_MS),
            str(slots),
        ]
        with log.open("w") as out:
            self.process = subprocess.Popen(
                hosts.command(n, *argv), stdout=subprocess.DEVNULL, stderr=out, env=env
            )

    def events(self) -> list[dict[str, Any]]:
        """The events written so far (a line still being written is left for the next read)."""
        found = []
        for line in self.log.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return found

    def runs(self, event: str) -> set[str]:
        """The runs this worker logged ``event`` for."""
        return {e["run_id"] for e in self.events() if e["event"] == event and "run_id" in e}

    def held(self) -> set[str]:
        """Runs claimed and neither ended, parked, nor let go by this worker."""
        return self.runs("claimed") - self.runs("ended") - self.runs("parked") - self.runs("lost")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=30)


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, detail: Callable[[], str] = lambda: ""
) -> float:
    """Poll ``condition`` until true; the seconds it took. Fails naming ``what`` (and ``detail``) after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout} s waiting for {what}{detail()}", pytrace=False)
        time.sleep(0.02)
    return time.monotonic() - started


def activity(url: str) -> list[tuple[Any, ...]]:
    """What the server's sessions are doing (for a failure's message)."""
    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as admin:
        return admin.execute(
            "SELECT client_addr::text, state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND state <> 'idle'"
        ).fetchall()


def started(worker: WorkerProcess) -> bool:
    """Whether the worker logged ``started`` (and is alive)."""
    assert worker.process.poll() is None, f"worker {worker.owner} exited: {worker.log.read_text()[-2000:]}"
    return any(e["event"] == "started" for e in worker.events())


def chain(name: str, steps: int) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(steps)
    )
    return WorkflowSpec(workflow_id=f"netns.{name}", version=1, nodes=nodes)


def history(journal: PostgresJournal, run: str) -> list[Any]:
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run)]


def check_history(run: str, events: list[Any], steps: int) -> dict[str, NodeOutcomeCommitted]:
    """Assert the run succeeded once, every node has one outcome, attempts numbered 1..n with no gap or repeat."""
    completed = [e for e in events if isinstance(e, RunCompleted)]
    assert len(completed) == 1, f"run {run}: {len(completed)} RunCompleted events"
    assert completed[0].result == "succeeded", f"run {run}: {completed[0].result}"
    starts: dict[str, list[NodeStarted]] = collections.defaultdict(list)
    for event in events:
        if isinstance(event, NodeStarted):
            starts[event.node_id].append(event)
    outcomes: dict[str, list[NodeOutcomeCommitted]] = collections.defaultdict(list)
    for event in events:
        if isinstance(event, NodeOutcomeCommitted):
            outcomes[event.node_id].append(event)
    nodes = {f"n{i}" for i in range(steps)}
    assert set(outcomes) == nodes and set(starts) == nodes, f"run {run}: nodes {sorted(outcomes)}"
    for node, started_ in starts.items():
        numbers = [s.attempt for s in started_]
        assert numbers == list(range(1, len(numbers) + 1)), f"run {run} node {node}: attempts {numbers}"
        assert len({s.attempt_id for s in started_}) == len(started_), f"run {run} node {node}: reused id"
        committed = outcomes[node]
        assert len(committed) == 1, f"run {run} node {node}: {len(committed)} committed outcomes"
        assert committed[0].attempt_id == started_[-1].attempt_id, f"run {run} node {node}: stray outcome"
    return {node: committed[0] for node, committed in outcomes.items()}


class Finished:
    """Which runs the store says are terminal (each asked until it is, then remembered)."""

    def __init__(self, journal: PostgresJournal, runs: list[str]) -> None:
        self.journal = journal
        self.runs = runs
        self.done: set[str] = set()

    def all(self) -> bool:
        """Whether every run's index entry is terminal."""
        for run in self.runs:
            if run not in self.done:
                entry = self.journal.index_get(run)
                if entry is None or entry.status is not IndexStatus.TERMINAL:
                    return False
                self.done.add(run)
        return True


def test_a_partitioned_worker_is_fenced_when_it_returns_and_its_runs_finish_elsewhere(
    hosts: Hosts, url: str, tmp_path: Path
) -> None:
    """A's link goes down mid-run; B finishes A's runs; A's link comes back and every append of A is refused."""
    steps = 6
    a = WorkerProcess(hosts, 0, url, "host-a", tmp_path / "a.log", step_s=0.3, slots=4)
    b = WorkerProcess(hosts, 1, url, "host-b", tmp_path / "b.log", step_s=0.3, slots=4)
    try:
        wait_for(lambda: started(a) and started(b), 60, "both workers to start")
        with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
            runtime = WorkflowRuntime(journal, leases=leases)
            runs = [runtime.start(chain("partition", steps)).run_id for _ in range(8)]

            def outcomes_of(run: str) -> int:
                return sum(isinstance(e, NodeOutcomeCommitted) for e in history(journal, run))

            # A holds runs that are under way: some of their nodes are committed, the rest still to run.
            wait_for(lambda: len(a.held()) >= 2, 60, "worker A to claim runs")
            under_way = a.held()
            wait_for(lambda: all(outcomes_of(run) >= 1 for run in under_way), 60, "A's runs to progress")
            hosts.cut(0)
            cut_at = time.monotonic()
            finished = Finished(journal, runs)
            wait_for(
                # Every run terminal in the store, and B's log caught up with the runs it took from A.
                lambda: finished.all() and a.runs("claimed") & b.runs("claimed") <= b.runs("ended"),
                90,
                "every run to end while A is cut off",
                lambda: f"; server: {activity(url)}; B logged: {b.log.read_text()[-3000:]}",
            )
            takeover = time.monotonic() - cut_at
            # B can claim a run of A's only once A's lease expired: these are the runs the partition took.
            taken = a.runs("claimed") & b.runs("claimed")
            assert taken, "A finished its runs before the cut: nothing was partitioned"
            assert taken <= b.runs("ended") and not taken & a.runs("ended")
            before = {run: [(r.sequence, r.event_id) for r in journal.read(run)] for run in taken}
            hosts.restore(0)
            back = wait_for(
                lambda: taken <= a.runs("lost"),
                120,
                f"A to let go of {sorted(taken)} once back",
                lambda: f"; A logged: {a.log.read_text()[-3000:]}",
            )
            lost = {e["run_id"]: e["error"] for e in a.events() if e["event"] == "lost"}
            for run in taken:
                assert "fencing token" in lost[run] or "taken over" in lost[run], lost[run]
                after = [(r.sequence, r.event_id) for r in journal.read(run)]
                assert after == before[run], f"A wrote to run {run} after it came back"
            for run in runs:
                committed = check_history(run, history(journal, run), steps)
                if run in taken:
                    assert committed[f"n{steps - 1}"].outcome.output["worker"] == "host-b"
            assert runtime.handle(runs[0]).status() == "succeeded"
        assert a.process.poll() is None, "A crashed instead of letting go"
        kinds = sorted(
            {"fenced append" if "fencing token" in lost[run] else "lease taken over" for run in taken}
        )
        print(
            f"A held {len(taken)} runs under way at the cut; B finished every run {takeover:.2f} s after the cut "
            f"(TTL {TTL_MS} ms, poll {POLL_MS} ms); A let go of all of them {back:.2f} s after its link came "
            f"back ({', '.join(kinds)})"
        )
    finally:
        hosts.restore(0)
        for worker in (a, b):
            worker.stop()
    assert a.process.returncode == 0 and b.process.returncode == 0


def test_three_workers_share_200_runs_one_is_sigkilled_and_every_run_succeeds(
    hosts: Hosts, url: str, tmp_path: Path
) -> None:
    """200 runs over 3 worker processes in 3 namespaces; one is SIGKILLed mid-way; all succeed, none renumbered."""
    steps = 3
    workers = [
        WorkerProcess(hosts, n, url, f"host-{n}", tmp_path / f"w{n}.log", step_s=0.3, slots=16)
        for n in range(3)
    ]
    victim, survivors = workers[0], workers[1:]
    try:
        boot = wait_for(lambda: all(started(w) for w in workers), 60, "three workers to start")
        with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
            runtime = WorkflowRuntime(journal, leases=leases)

            def due() -> bool:
                """Mid-way: 60 runs ended, ten of them in the victim, which holds at least four under way."""
                ended = sum(len(w.runs("ended")) for w in workers)
                return ended >= 60 and len(victim.runs("ended")) >= 10 and len(victim.held()) >= 4

            def kill() -> float:
                victim.process.send_signal(signal.SIGKILL)
                victim.process.wait(timeout=30)
                return time.monotonic()

            # Workers keep pace with one submitter, so the victim is killed while runs are still submitted.
            submitting = time.monotonic()
            runs: list[str] = []
            killed_at: float | None = None
            for n in range(200):
                runs.append(runtime.start(chain("kill", steps)).run_id)
                if killed_at is None and n % 5 == 4 and due():
                    killed_at = kill()
            submitted = time.monotonic() - submitting
            if killed_at is None:
                wait_for(due, 90, "a third of the runs to end, ten of them in the victim")
                killed_at = kill()
            wait_for(Finished(journal, runs).all, 120, "every run to end after the SIGKILL")
            recovered = time.monotonic() - killed_at
            # A survivor claims a run the victim claimed only once the victim's lease expired.
            orphans = victim.runs("claimed") & set().union(*(w.runs("claimed") for w in survivors))
            assert orphans, "the victim held no unfinished run when it was killed: nothing was recovered"
            assert not orphans & victim.runs("ended")
            ends = collections.Counter(
                e["run_id"] for w in workers for e in w.events() if e["event"] == "ended"
            )
            assert max(ends.values()) == 1, "a run ended in two workers"
            checking = time.monotonic()
            for run in runs:
                check_history(run, history(journal, run), steps)
            checked = time.monotonic() - checking
        share = {w.owner: len(w.runs("ended")) for w in workers}
        print(
            f"runs ended per worker {share}; {len(orphans)} runs of the victim finished by the others; "
            f"every run ended {recovered:.2f} s after the SIGKILL (TTL {TTL_MS} ms, poll {POLL_MS} ms); "
            f"workers up in {boot:.2f} s, 200 runs submitted in {submitted:.2f} s, runs checked in {checked:.2f} s"
        )
    finally:
        for worker in workers:
            worker.stop()
    assert [w.process.returncode for w in survivors] == [0, 0]


HOLDER = """
import sys, time
from psycopg import sql
from mayfly_postgres import PostgresJournal

with PostgresJournal(sys.argv[1]) as journal:
    runs = journal._store.table("runs")
    # The shape of an indexed append: a statement run and fetched in a pipeline, no Sync yet.
    with journal._store.pool.connection() as connection, connection.pipeline():
        locked = sql.SQL("SELECT FROM {} WHERE run_id = %s::uuid FOR UPDATE").format(runs)
        connection.execute(locked, (sys.argv[2],)).fetchall()
        print("locked", flush=True)
        time.sleep(600)
"""


def test_a_host_cut_off_mid_transaction_has_its_session_ended_by_the_server(hosts: Hosts, url: str) -> None:
    """A journal connection cut off inside a pipelined transaction stops holding the run's row lock.

    An indexed append waits on the client between its statement and its Sync,
    holding the run's rows locked; if the client's host is cut off there, no
    other worker can take the run over until the server drops the session. The
    journal's connections ask the server to notice a vanished client (TCP
    keepalives and user timeout), so the lock goes within seconds, not hours.
    """
    with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
        run = WorkflowRuntime(journal, leases=leases).start(chain("held", 1)).run_id
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        holder = subprocess.Popen(
            hosts.command(2, sys.executable, "-c", HOLDER, url, run),
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            hosts.cut(2)
            with psycopg.connect(url.split("?", 1)[0], autocommit=True) as admin:
                statement = psycopg.sql.SQL("SELECT FROM {}.runs WHERE run_id = %s::uuid FOR UPDATE NOWAIT")
                probe = statement.format(psycopg.sql.Identifier(journal.schema))

                def lock_free() -> bool:
                    try:
                        with admin.transaction():
                            admin.execute(probe, (run,))
                    except psycopg.errors.LockNotAvailable:
                        return False
                    return True

                assert not lock_free(), "the holder's lock was not held: nothing was tested"
                freed = wait_for(lock_free, 60, "the server to end the cut-off session and free its lock")
            print(f"the cut-off session's row lock was freed {freed:.2f} s after the cut")
        finally:
            hosts.restore(2)
            holder.kill()
            holder.wait(timeout=30)
