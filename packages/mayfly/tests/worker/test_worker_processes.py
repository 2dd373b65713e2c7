"""`mayfly submit` and `mayfly worker` as a user runs them: separate processes, SIGKILL, SIGTERM, several workers.

Every check is made from the journal (the facts), never from logs: attempts
committed once, re-invocations under their original attempt ids, no run
driven by two workers at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mayfly import WorkflowSpec
from mayfly.local import LocalWorkflowJournal
from mayfly.reducer import decode_event
from mayfly.runtime import WorkflowRuntime

pytestmark = pytest.mark.slow

HANDLERS = """
import os, time
from mayfly import HandlerRegistry, Succeeded, RetryableFailure
from mayfly.runtime import WaitForSignal, new_signal_token

registry = HandlerRegistry()
TOKENS = os.environ.get("TEST_TOKENS")

@registry.handler("step", version=1)
def step(req):
    # Two owners driving one run at once would run two of its handlers at once: record any overlap.
    marker = os.path.join(os.environ["TEST_ACTIVE"], req.run_id)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        open(os.path.join(os.environ["TEST_ACTIVE"], "overlap-" + req.run_id), "w").close()
        raise
    try:
        time.sleep(float(os.environ.get("TEST_STEP_S", "0.01")))
    finally:
        os.close(fd)
        os.unlink(marker)
    return Succeeded(output={"node": req.node_id})

@registry.handler("count", version=1)
def count(req):
    # Every invocation is recorded, so a test can tell a re-invocation from a re-run.
    with open(os.path.join(os.environ["TEST_CALLS"], req.run_id), "a") as f:
        f.write(f"{req.node_id} {req.attempt_id}\\n")
    if req.node_id == "n1" and os.environ.get("TEST_HANG"):
        time.sleep(120)  # this worker is killed here
    return Succeeded()

@registry.handler("flaky", version=1)
def flaky(req):
    if req.attempt == 1:
        return RetryableFailure(reason="first attempt always fails")
    return Succeeded()

@registry.handler("approve", version=1)
def approve(req):
    if req.signal is None:
        token = new_signal_token()
        with open(os.path.join(TOKENS, req.run_id), "w") as f:
            f.write(token.reveal())
        return WaitForSignal("approval", token, timeout_ms=3_600_000)
    return Succeeded(output=req.signal.decision)
"""


def spec(name: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"workflow_id": f"worker.{name}", "version": 1, "nodes": nodes}


CHAIN = spec(
    "chain",
    [{"id": f"n{i}", "handler": "step@1", **({"depends_on": [f"n{i - 1}"]} if i else {})} for i in range(4)],
)
BACKOFF = spec(
    "backoff",
    [
        {
            "id": "f",
            "handler": "flaky@1",
            "retry": {"max_attempts": 2, "backoff": {"type": "fixed", "delay_ms": 2000}},
        }
    ],
)
APPROVAL = spec(
    "approval",
    [
        {"id": "draft", "handler": "step@1"},
        {"id": "approval", "handler": "approve@1", "depends_on": ["draft"], "retry": {"max_attempts": 1}},
        {"id": "ship", "handler": "step@1", "depends_on": ["approval"]},
    ],
)


class Env:
    """A store, a handlers module and the environment every `mayfly` process of a test runs with."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}/store"
        (root / "tokens").mkdir()
        (root / "active").mkdir()
        (root / "calls").mkdir()
        self.handlers = root / "handlers.py"
        self.handlers.write_text(HANDLERS)
        self.env = {
            **os.environ,
            "TEST_TOKENS": str(root / "tokens"),
            "TEST_ACTIVE": str(root / "active"),
            "TEST_CALLS": str(root / "calls"),
            "PYTHONUNBUFFERED": "1",
        }
        self.workers: list[subprocess.Popen[str]] = []

    def cli(self, *args: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "mayfly", "--journal", self.url, *args],
            check=False,
            capture_output=True,
            text=True,
            env={**self.env, **extra},
            timeout=120,
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def start(self, document: dict[str, Any], count: int, queue: str = "default") -> list[str]:
        """Submit ``count`` runs through the API (one process), as an application would."""
        runtime = WorkflowRuntime(self.url)
        spec = WorkflowSpec.from_json(json.dumps(document))
        return [runtime.start(spec, queue=queue).run_id for _ in range(count)]

    def submit(self, document: dict[str, Any], **kwargs: str) -> str:
        """Submit one run with `mayfly submit`, as a user would."""
        path = self.root / f"{document['workflow_id']}.json"
        path.write_text(json.dumps(document))
        extra = [item for key, value in kwargs.items() for item in (f"--{key.replace('_', '-')}", value)]
        run_id: str = json.loads(self.cli("submit", str(path), "--json", *extra).stdout)["run_id"]
        return run_id

    def worker(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mayfly",
                "--journal",
                self.url,
                "worker",
                "--json",
                "--handlers",
                str(self.handlers),
                "--poll-interval",
                "100",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **extra},
        )
        self.workers.append(process)
        return process

    def status(self, run_id: str) -> dict[str, Any]:
        """The run's result as `mayfly result --json` prints it (read in this process: it is polled)."""
        summary = WorkflowRuntime(self.url).summary(run_id)
        decoded: dict[str, Any] = json.loads(msgspec.json.encode(summary))
        return decoded

    def wait_all(self, run_ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(run_ids)
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending if self.status(r)["status"] == "running"]
            if pending:
                time.sleep(0.2)
        assert not pending, f"{len(pending)} run(s) still running after {timeout} s"

    def stop(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    environment = Env(tmp_path)
    yield environment
    environment.stop()


def history(env: Env, run_id: str) -> list[Any]:
    with LocalWorkflowJournal(env.url) as journal:
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def attempts(events: list[Any]) -> tuple[dict[str, str], dict[str, int]]:
    """Started attempt ids by node, and how many outcomes each attempt id got."""
    started: dict[str, str] = {}
    outcomes: dict[str, int] = {}
    for event in events:
        kind = type(event).__name__
        if kind == "NodeStarted":
            started.setdefault(event.node_id, event.attempt_id)
        if kind == "NodeOutcomeCommitted" and event.attempt_id is not None:
            outcomes[event.attempt_id] = outcomes.get(event.attempt_id, 0) + 1
    return started, outcomes


def test_forty_runs_finish_while_a_killed_worker_is_replaced(env: Env) -> None:
    """40 submitted runs succeed though their worker is SIGKILLed mid-way; in-flight attempts finish under their ids."""
    runs = env.start(CHAIN, 40)
    first = env.worker("--concurrency", "8", TEST_STEP_S="0.2")
    runtime = WorkflowRuntime(env.url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        runtime.inspect(run_id).state.active_count for run_id in runs[:8]
    ):
        time.sleep(0.05)
    time.sleep(0.5)  # a few nodes in: some runs are half done, with attempts in flight
    first.kill()  # SIGKILL: attempts in flight stay in flight in the journal
    first.wait()
    for marker in (env.root / "active").iterdir():
        marker.unlink()  # the killed handlers' markers
    in_flight = {
        (run_id, runtime.inspect(run_id).state.node(index).node_id): attempt_id
        for run_id in runs
        for attempt_id, index in runtime.inspect(run_id).state.active_attempts()
    }
    assert in_flight, "the kill came when no attempt was in flight; nothing was recovered"
    env.worker("--concurrency", "8", TEST_STEP_S="0.01")
    env.wait_all(runs, 120)
    for run_id in runs:
        assert env.status(run_id)["status"] == "succeeded"
        events = history(env, run_id)
        started, outcomes = attempts(events)
        assert set(outcomes.values()) == {1}  # every attempt committed exactly once
        starts = [e for e in events if type(e).__name__ == "NodeStarted"]
        assert len(starts) == 4  # no node was started twice: nothing renumbered
    for (run_id, node_id), attempt_id in in_flight.items():
        started, outcomes = attempts(history(env, run_id))
        assert started[node_id] == attempt_id and outcomes[attempt_id] == 1


def test_a_backoff_that_elapsed_while_no_worker_ran_completes_at_once(env: Env) -> None:
    """A run retrying after a 2 s backoff: no worker for 3 s, then one starts and the run ends promptly."""
    run_id = env.submit(BACKOFF)
    first = env.worker()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and env.status(run_id)["nodes"]["f"]["attempts"] < 1:
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    time.sleep(3.0)  # the backoff ends while no worker runs
    started = time.monotonic()
    env.worker()
    env.wait_all([run_id], 30)
    assert env.status(run_id)["status"] == "succeeded"
    assert time.monotonic() - started < 10


def test_an_approval_delivered_with_mayfly_signal_alone_finishes_its_run(env: Env) -> None:
    """A worker parks the run on its approval; `mayfly signal` is the only other command, and the run ships."""
    env.worker()
    run_id = env.submit(APPROVAL)
    token_file = env.root / "tokens" / run_id
    deadline = time.monotonic() + 30
    while not token_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + 30
    while env.status(run_id)["waiting"] == {} and time.monotonic() < deadline:
        time.sleep(0.1)
    env.cli("signal", run_id, "approval", "--token", token_file.read_text(), "--decision", "approve")
    env.wait_all([run_id], 30)
    result = env.status(run_id)
    assert result["status"] == "succeeded"
    assert result["outputs"]["approval"]["decision"] == "approve"
    printed = env.cli("result", run_id, "--wait", "--timeout", "5")
    assert f"run {run_id}: succeeded" in printed.stdout


def test_a_worker_exits_zero_within_its_grace_period_on_sigterm(env: Env) -> None:
    """SIGTERM: no new claims, the attempt in flight finishes, leases are released, exit 0 within the grace."""
    runs = env.start(CHAIN, 3)
    worker = env.worker("--grace", "10", TEST_STEP_S="1.0")
    assert worker.stderr is not None
    seen = [json.loads(worker.stderr.readline())["event"]]  # "started": its signal handlers are in place
    while "claimed" not in seen:
        seen.append(json.loads(worker.stderr.readline())["event"])
    time.sleep(0.3)  # an attempt is in flight (each step takes a second)
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert time.monotonic() - sent < 10
    _, stderr = worker.communicate()
    events = seen + [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "stopping" in events and events[-1] == "stopped"
    # Handed over at once: a new worker finishes every run without waiting for a lease to expire.
    env.worker()
    env.wait_all(runs, 60)
    for run_id in runs:
        _, outcomes = attempts(history(env, run_id))
        assert set(outcomes.values()) == {1}


def test_four_workers_never_drive_one_run_twice_at_once(env: Env) -> None:
    """K=4 workers race for 30 runs: each run's facts come from one owner at a time (one fencing token per start)."""
    runs = env.start(CHAIN, 30)
    for _ in range(4):
        env.worker("--concurrency", "4", TEST_STEP_S="0.02")
    env.wait_all(runs, 120)
    for run_id in runs:
        events = history(env, run_id)
        started, outcomes = attempts(events)
        assert len(started) == 4
        assert set(outcomes.values()) == {1}
        assert sum(1 for e in events if type(e).__name__ == "NodeStarted") == 4
    assert not list((env.root / "active").glob("overlap-*")), "a run's handlers ran in two workers at once"


def test_an_idle_worker_starts_a_submitted_run_without_waiting_for_its_poll(env: Env) -> None:
    """With a one-minute poll interval, a submitted run still completes at once: the submit wakes the worker."""
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mayfly",
            "--journal",
            env.url,
            "worker",
            "--json",
            "--handlers",
            str(env.handlers),
            "--poll-interval",
            "60000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env.env,
    )
    env.workers.append(worker)
    assert worker.stderr is not None
    assert json.loads(worker.stderr.readline())["event"] == "started"
    time.sleep(0.5)  # the worker has polled once and sleeps for a minute now
    (run_id,) = env.start(CHAIN, 1)
    env.wait_all([run_id], 20)  # well under the poll interval: only a wake-up explains it
    assert env.status(run_id)["status"] == "succeeded"


def test_a_rolling_restart_strands_nothing(env: Env) -> None:
    """A new worker starts while the old one drains after SIGTERM: every run ends, every attempt once."""
    runs = env.start(CHAIN, 20)
    old = env.worker("--concurrency", "4", "--grace", "20", TEST_STEP_S="0.3")
    assert old.stderr is not None
    while json.loads(old.stderr.readline())["event"] != "claimed":
        pass
    env.worker("--concurrency", "4", TEST_STEP_S="0.3")
    old.send_signal(signal.SIGTERM)
    assert old.wait(timeout=60) == 0
    env.wait_all(runs, 120)
    for run_id in runs:
        assert env.status(run_id)["status"] == "succeeded"
        _, outcomes = attempts(history(env, run_id))
        assert set(outcomes.values()) == {1}
    assert not list((env.root / "active").glob("overlap-*"))


COUNTED = spec(
    "counted",
    [{"id": f"n{i}", "handler": "count@1", **({"depends_on": [f"n{i - 1}"]} if i else {})} for i in range(3)],
)


def test_a_recovered_run_continues_with_its_next_step_on_a_queue_of_one(env: Env) -> None:
    """A worker serving one run at a time dies after a run's first step; the next one carries on from step two.

    The queue holds more runs behind the recovered one; a worker limited to
    that queue and to one run at a time finishes them all, re-invokes the
    interrupted step under its attempt id, and never re-runs the committed
    step. A run on another queue is left alone.
    """
    (crashed,) = env.start(COUNTED, 1, queue="solo")
    first = env.worker("--concurrency", "1", "--queue", "solo", TEST_HANG="1")
    calls = env.root / "calls" / crashed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "n1" not in (calls.read_text() if calls.exists() else ""):
        time.sleep(0.05)
    first.kill()  # n0 committed, n1 in flight
    first.wait()
    state = WorkflowRuntime(env.url).inspect(crashed).state
    assert state.node(0).status.value == "succeeded" and state.active_count == 1
    behind = env.start(COUNTED, 2, queue="solo")
    (elsewhere,) = env.start(COUNTED, 1, queue="other")
    env.worker("--concurrency", "1", "--queue", "solo")
    env.wait_all([crashed, *behind], 60)
    for run_id in (crashed, *behind):
        assert env.status(run_id)["status"] == "succeeded"
    lines = [line.split() for line in calls.read_text().splitlines()]
    assert [node for node, _ in lines] == ["n0", "n1", "n1", "n2"]  # n0 ran once; n1 was re-invoked
    assert lines[1][1] == lines[2][1]  # under its original attempt id
    for run_id in behind:
        assert [line.split()[0] for line in (env.root / "calls" / run_id).read_text().splitlines()] == [
            "n0",
            "n1",
            "n2",
        ]
    assert env.status(elsewhere)["status"] == "running"
    assert not (env.root / "calls" / elsewhere).exists()
