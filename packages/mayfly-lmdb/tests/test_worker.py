"""mayfly.worker.Worker on LMDB: started runs are claimed and driven to the end, parked runs woken by a signal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.reducer import decode_event
from mayfly.runindex import IndexStatus
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker
from mayfly_lmdb import LmdbJournal


def chain(name: str, length: int, handler: str) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=handler, depends_on=(f"n{i - 1}",) if i else ()) for i in range(length)
    )
    return WorkflowSpec(workflow_id=f"lmdb.{name}", version=1, nodes=nodes)


def test_fifty_started_runs_are_driven_to_success_by_one_worker(url: str) -> None:
    """50 runs created with start() are claimed and finished by a worker; every node ran exactly once."""
    registry = HandlerRegistry()
    calls: dict[str, int] = {}

    def step(req: Any) -> Any:
        key = f"{req.run_id}/{req.node_id}"
        calls[key] = calls.get(key, 0) + 1
        return Succeeded(output={"node": req.node_id})

    registry.register("step", 1, step, cooperative=True)
    runtime = WorkflowRuntime(url, registry)
    spec = chain("fifty", 3, "step@1")
    handles = [runtime.start(spec) for _ in range(50)]
    ended: list[str] = []

    def log(event: dict[str, Any]) -> None:
        if event["event"] == "ended":
            ended.append(event["run_id"])

    worker = Worker(url, registry, concurrency=20, poll_interval_ms=50, log=log)
    deadline = time.monotonic() + 60
    worker.run(until=lambda: len(ended) >= len(handles) or time.monotonic() > deadline)
    assert sorted(ended) == sorted(handle.run_id for handle in handles)
    assert set(calls.values()) == {1} and len(calls) == 150
    with LmdbJournal(url) as journal:
        for handle in handles:
            assert handle.status() == "succeeded"
            entry = journal.index_get(handle.run_id)
            assert entry is not None and entry.status is IndexStatus.TERMINAL
            started = [
                record
                for record in journal.read(handle.run_id)
                if type(decode_event(record.event_type, record.schema_version, record.payload)).__name__
                == "NodeStarted"
            ]
            assert len(started) == 3
        assert journal.claim("late", limit=10, ttl_ms=1_000, now_ms=int(time.time() * 1000)) == []


HANDLERS = """
import os
from mayfly import HandlerRegistry, Succeeded
from mayfly.runtime import WaitForSignal, new_signal_token

registry = HandlerRegistry()

@registry.handler("approve", version=1)
def approve(req):
    if req.signal is None:
        token = new_signal_token()
        with open(os.path.join(os.environ["TEST_TOKENS"], req.run_id), "w") as f:
            f.write(token.reveal())
        return WaitForSignal("approval", token, timeout_ms=3_600_000)
    return Succeeded(output=req.signal.decision)

@registry.handler("ship", version=1)
def ship(req):
    return Succeeded(output={"shipped": True})
"""


@pytest.mark.slow
def test_a_signal_from_another_process_wakes_a_parked_run_in_an_idle_worker(tmp_path: Path) -> None:
    """A worker process (one-minute poll) parks a run on its approval; `mayfly signal` wakes it at once."""
    url = f"lmdb://{tmp_path}/env"
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    env = {**os.environ, "TEST_TOKENS": str(tokens), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "mayfly", "--journal", url]
    worker = subprocess.Popen(
        [*command, "worker", "--json", "--handlers", str(handlers), "--poll-interval", "60000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # A watchdog: should no wake-up come, the worker is killed and its log ends (the test fails, never hangs).
    watchdog = threading.Timer(45, worker.kill)
    watchdog.start()
    try:
        assert worker.stderr is not None
        assert json.loads(worker.stderr.readline())["event"] == "started"
        spec = WorkflowSpec(
            workflow_id="lmdb.approval",
            version=1,
            nodes=(
                Node("approval", handler="approve@1"),
                Node("ship", handler="ship@1", depends_on=("approval",)),
            ),
        )
        runtime = WorkflowRuntime(url)
        handle = runtime.start(spec)  # the start wakes the idle worker
        events = []
        while "parked" not in events:
            line = json.loads(worker.stderr.readline())
            if line.get("run_id") == handle.run_id:
                events.append(line["event"])
        assert events == ["claimed", "parked"]
        entry = runtime.journal.index_get(handle.run_id)  # type: ignore[attr-defined]
        assert entry.status is IndexStatus.WAITING and not entry.wake
        token = (tokens / handle.run_id).read_text()
        sent = time.monotonic()
        signalled = subprocess.run(
            [*command, "signal", handle.run_id, "approval", "--token", token, "--decision", "approve"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert signalled.returncode == 0, signalled.stderr
        while True:
            line = json.loads(worker.stderr.readline())
            if line.get("run_id") == handle.run_id and line["event"] == "ended":
                break
        # Well under the one-minute poll interval: only the wake-up the signal sent explains it.
        assert time.monotonic() - sent < 30
        assert handle.status() == "succeeded"
        assert runtime.summary(handle.run_id).outputs["approval"]["decision"] == "approve"
    finally:
        watchdog.cancel()
        worker.kill()
        worker.wait(timeout=30)
