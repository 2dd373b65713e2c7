"""The Redis run index across processes: racing claimants, workers started and woken, and a writer SIGKILLed.

Every check is made from the store (leases, journals, index entries), never from logs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.recovery import inspect_run
from mayfly.runindex import IndexEntry, IndexStatus, index_entry, more_claimable
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker
from mayfly_redis import RedisJournal
from mayfly_redis.testing import RedisServer

pytestmark = pytest.mark.slow

NOW = 1_800_000_000_000

CLAIMANT = textwrap.dedent(
    """
    import sys, time
    from mayfly_redis import RedisJournal
    url, name, now = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with RedisJournal(url) as journal:
        print("ready", flush=True)
        sys.stdin.readline()  # every claimant starts at once
        idle = 0
        while idle < 20:
            guards = journal.claim(name, limit=7, ttl_ms=600_000, now_ms=now)
            idle = 0 if guards else idle + 1
            for guard in guards:
                print(guard.run_id, guard.fencing_token, flush=True)
            time.sleep(0 if guards else 0.01)
        print("done", flush=True)
        sys.stdin.readline()  # closing releases the leases: only once every claimant is done
    """
)


def test_four_claimant_processes_racing_over_200_runs_claim_each_exactly_once(
    aof_server: RedisServer, tmp_path: Path
) -> None:
    """K=4 processes claim from 200 runnable runs at once: every run is handed to exactly one of them."""
    url = f"{aof_server.url}?prefix=race.{uuid.uuid4().hex[:8]}"
    runs = [str(uuid.uuid4()) for _ in range(200)]
    with RedisJournal(url) as journal:
        journal.index_put(
            [
                IndexEntry(run_id=run, status=IndexStatus.NEW, ready_at_ms=NOW - i, sequence=1)
                for i, run in enumerate(runs)
            ]
        )
    script = tmp_path / "claimant.py"
    script.write_text(CLAIMANT)
    claimants = [
        subprocess.Popen(
            [sys.executable, str(script), url, f"claimant-{i}", str(NOW)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for process in claimants:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in claimants:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    # A claimant that is done still holds its leases: closing would release them to the others.
    outputs: list[list[str]] = []
    for process in claimants:
        assert process.stdout is not None
        got = []
        while (line := process.stdout.readline()) != "done\n":
            assert line, "a claimant ended before it was done"
            got.append(line.split()[0])
        outputs.append(got)
    for process in claimants:
        process.communicate("exit\n", timeout=120)
    assert all(process.returncode == 0 for process in claimants)
    taken = [run for output in outputs for run in output]
    assert sorted(taken) == sorted(runs)  # all of them, none twice
    assert all(outputs), "a claimant got nothing: the race was not a race"


def chain(name: str, length: int, handler: str = "step@1") -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=handler, depends_on=(f"n{i - 1}",) if i else ()) for i in range(length)
    )
    return WorkflowSpec(workflow_id=f"redis.{name}", version=1, nodes=nodes)


def test_a_worker_on_redis_finishes_fifty_started_runs(aof_server: RedisServer) -> None:
    """50 runs started with WorkflowRuntime.start are claimed and driven to success by one Worker on Redis."""
    url = f"{aof_server.url}?prefix=worker.{uuid.uuid4().hex[:8]}"
    registry = HandlerRegistry()
    registry.register("step", 1, lambda req: Succeeded(output={"node": req.node_id}), cooperative=True)
    runtime = WorkflowRuntime(url, registry)
    handles = [runtime.start(chain("fifty", 3)) for _ in range(50)]
    ended: list[str] = []

    def log(event: dict[str, Any]) -> None:
        if event["event"] == "ended":
            ended.append(event["run_id"])

    worker = Worker(url, registry, concurrency=16, poll_interval_ms=50, log=log)
    deadline = time.monotonic() + 60
    worker.run(until=lambda: len(ended) >= 50 or time.monotonic() > deadline)
    assert sorted(ended) == sorted(handle.run_id for handle in handles)
    assert all(handle.status() == "succeeded" for handle in handles)
    journal = runtime.journal
    assert isinstance(journal, RedisJournal)
    assert all(journal.index_get(h.run_id).status is IndexStatus.TERMINAL for h in handles)  # type: ignore[union-attr]
    assert journal.claim("late", limit=10, ttl_ms=1_000, now_ms=int(time.time() * 1000)) == []


HANDLERS = textwrap.dedent(
    """
    import os
    from mayfly import HandlerRegistry, Succeeded
    from mayfly.runtime import WaitForSignal, new_signal_token

    registry = HandlerRegistry()

    @registry.handler("step", version=1)
    def step(req):
        return Succeeded()

    @registry.handler("approve", version=1)
    def approve(req):
        if req.signal is None:
            token = new_signal_token()
            with open(os.path.join(os.environ["TEST_TOKENS"], req.run_id), "w") as f:
                f.write(token.reveal())
            return WaitForSignal("approval", token, timeout_ms=3_600_000)
        return Succeeded(output=req.signal.decision)
    """
)


@pytest.fixture
def worker_env(aof_server: RedisServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    (tmp_path / "tokens").mkdir()
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    env = {**os.environ, "TEST_TOKENS": str(tmp_path / "tokens"), "PYTHONUNBUFFERED": "1"}
    url = f"{aof_server.url}?prefix=proc.{uuid.uuid4().hex[:8]}"
    processes: list[subprocess.Popen[str]] = []
    yield {
        "url": url,
        "env": env,
        "handlers": handlers,
        "tokens": tmp_path / "tokens",
        "processes": processes,
    }
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def mayfly(env: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mayfly", "--journal", env["url"], *args],
        capture_output=True,
        text=True,
        env=env["env"],
        timeout=120,
        check=False,
    )


def test_an_idle_worker_process_is_woken_by_a_submit_and_by_a_signal_from_another_process(
    worker_env: dict[str, Any],
) -> None:
    """With a one-minute poll, a worker process starts a submitted run and resumes it when `mayfly signal` runs."""
    command = [sys.executable, "-m", "mayfly", "--journal", worker_env["url"], "worker", "--json"]
    worker = subprocess.Popen(
        [*command, "--handlers", str(worker_env["handlers"]), "--poll-interval", "60000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env["env"],
    )
    worker_env["processes"].append(worker)
    assert worker.stderr is not None
    assert json.loads(worker.stderr.readline())["event"] == "started"
    time.sleep(0.5)  # it has polled once and sleeps for a minute now
    spec = WorkflowSpec(
        workflow_id="redis.approval",
        version=1,
        nodes=(
            Node("draft", handler="step@1"),
            Node("approval", handler="approve@1", depends_on=("draft",)),
            Node("ship", handler="step@1", depends_on=("approval",)),
        ),
    )
    runtime = WorkflowRuntime(worker_env["url"])
    run_id = runtime.start(spec).run_id
    token_file = worker_env["tokens"] / run_id
    deadline = time.monotonic() + 20
    while not token_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert token_file.exists(), "the submitted run was not started well within the poll interval"
    while runtime.summary(run_id).waiting == {} and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # parked: detached, its lease released
    signalled = mayfly(
        worker_env, "signal", run_id, "approval", "--token", token_file.read_text(), "--decision", "approve"
    )
    assert signalled.returncode == 0, signalled.stderr
    deadline = time.monotonic() + 20
    while runtime.summary(run_id).status.value == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    summary = runtime.summary(run_id)
    assert summary.status.value == "succeeded"
    assert worker.poll() is None  # the same worker did it, within its minute of sleep
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


WRITER = textwrap.dedent(
    """
    import sys
    from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
    from mayfly.runtime import WorkflowRuntime
    from mayfly.model.spec import FixedBackoff, RetryPolicy
    from mayfly import RetryableFailure
    from mayfly.worker import Worker

    url = sys.argv[1]
    registry = HandlerRegistry()
    registry.register("step", 1, lambda req: Succeeded(), cooperative=True)
    registry.register(
        "flaky", 1,
        lambda req: RetryableFailure(reason="again") if req.attempt < 3 else Succeeded(),
        cooperative=True,
    )
    retry = RetryPolicy(max_attempts=5, backoff=FixedBackoff(delay_ms=30))
    nodes = tuple(
        Node(f"n{i}", handler="flaky@1" if i % 5 == 4 else "step@1", retry=retry,
             depends_on=(f"n{i - 1}",) if i else ())
        for i in range(60)
    )
    spec = WorkflowSpec(workflow_id="redis.crash", version=1, nodes=nodes)
    runtime = WorkflowRuntime(url, registry)
    for _ in range(20):
        print(runtime.start(spec).run_id, flush=True)
    print("started", flush=True)
    Worker(url, registry, concurrency=20, poll_interval_ms=20, log=lambda e: None).run()
    """
)


def test_entries_survive_a_writer_sigkill_and_a_server_crash_at_least_as_claimable_as_the_history(
    fresh_server: RedisServer, tmp_path: Path
) -> None:
    """SIGKILL a worker mid-appends, then the AOF server: each run's entry is at least as claimable as its replay."""
    url = fresh_server.url + "?prefix=crash"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    runs = []
    for line in writer.stdout:
        if line.strip() == "started":
            break
        runs.append(line.strip())
    time.sleep(1.5)  # the worker is mid-way through its runs' appends
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    fresh_server.kill()  # no shutdown: what was acknowledged is in the AOF, fsynced
    fresh_server.start()
    progressed = 0
    with RedisJournal(url) as journal:
        for run_id in runs:
            state = inspect_run(journal, run_id).state
            truth = index_entry(state)
            stored = journal.index_get(run_id)
            assert stored is not None, f"run {run_id} lost its entry"
            assert not more_claimable(truth, stored), (run_id, truth, stored)
            # Written in the same script as the records: exactly the entry of the replayed state.
            assert stored.sequence == truth.sequence and stored.status is truth.status
            assert stored.ready_at_ms == truth.ready_at_ms
            progressed += state.sequence > 2
        assert progressed, "the kill came before any run made progress"
        # The killed owner's leases run out, and every unfinished run is claimable by someone else.
        unfinished = {
            run_id
            for run_id in runs
            if journal.index_get(run_id).status is not IndexStatus.TERMINAL  # type: ignore[union-attr]
        }
        deadline = time.monotonic() + 60
        claimed: set[str] = set()
        while claimed != unfinished and time.monotonic() < deadline:
            wall = int(time.time() * 1000) + 60_000  # past every short retry backoff
            claimed |= {g.run_id for g in journal.claim("after", limit=100, ttl_ms=600_000, now_ms=wall)}
            time.sleep(0.2)
        assert claimed == unfinished
