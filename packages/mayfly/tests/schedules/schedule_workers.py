"""Two `mayfly worker` processes serving the journal's stored schedules: the harness of the stored-schedule tests.

Used by tests/schedules/test_stored_schedules.py (file journal) and by
packages/mayfly-postgres/tests/test_schedules.py (PostgreSQL), which puts this
directory on its path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import tick_run_id

HANDLERS = """
import os
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()

@registry.handler("tick", version=1)
def tick(req):
    # One file per invocation: a tick run twice would leave two.
    scheduled = req.run_input["scheduled_at_ms"]
    open(os.path.join(os.environ["TEST_CALLS"], f"{scheduled}-{os.getpid()}-{req.attempt_id}"), "w").close()
    return Succeeded()
"""
SPEC = {"workflow_id": "sched.stored", "version": 1, "nodes": [{"id": "n", "handler": "tick@1"}]}
POLL_MS = 200


class Site:
    """A test's journal, spec and handlers files, and its worker processes."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.calls = root / "calls"
        self.calls.mkdir()
        self.handlers = root / "handlers.py"
        self.handlers.write_text(HANDLERS)
        self.spec = root / "spec.json"
        self.spec.write_text(json.dumps(SPEC))
        self.env = {**os.environ, "TEST_CALLS": str(self.calls)}
        self.workers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def mayfly(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "mayfly", "--journal", self.url, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def start_workers(self, count: int) -> float:
        """Start ``count`` workers; return the time the last one said it started."""
        started = []
        for _ in range(count):
            log = self.root / f"worker-{len(self.workers)}.log"
            with log.open("wb") as stream:
                process = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "mayfly", "--journal", self.url, "worker", "--json"),
                        *("--handlers", str(self.handlers), "--poll-interval", str(POLL_MS)),
                    ],
                    stderr=stream,
                    env=self.env,
                )
            self.workers.append((process, log))
            started.append((process, log))
        for process, log in started:
            deadline = time.monotonic() + 60
            while not any(event["event"] == "started" for event in self.events(log)):
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.02)
        return time.time()

    def stop_workers(self) -> float:
        """SIGTERM every running worker, wait for exit 0; return when the signals were sent."""
        sent = time.time()
        running = [(p, log) for p, log in self.workers if p.poll() is None]
        for process, _ in running:
            process.send_signal(signal.SIGTERM)
        for process, log in running:
            assert process.wait(timeout=60) == 0, log.read_text()
        return sent

    @staticmethod
    def events(log: Path) -> list[dict[str, object]]:
        lines = log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def ticks_started(self, *schedules: str) -> dict[str, dict[int, str]]:
        """Every run in the journal, checked to be a tick run of one of ``schedules``: name -> tick -> run."""
        runtime = WorkflowRuntime(self.url)
        found: dict[str, dict[int, str]] = {name: {} for name in schedules}
        for run_id in runtime.journal.list_runs(limit=10_000):
            state = runtime.inspect(run_id).state
            assert isinstance(state.input, dict), state.input
            tick = state.input["scheduled_at_ms"]
            assert isinstance(tick, int)
            owners = [name for name in schedules if run_id == tick_run_id(name, tick)]
            assert len(owners) == 1, f"run {run_id} is no tick run of {schedules}"
            assert tick not in found[owners[0]]
            found[owners[0]][tick] = run_id
        runtime.journal.close()
        return found

    def handler_calls(self) -> list[int]:
        return sorted(int(name.split("-")[0]) for name in os.listdir(self.calls))

    def close(self) -> None:
        for process, _ in self.workers:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
