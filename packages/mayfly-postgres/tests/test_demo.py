"""The issue's acceptance check: `mayfly demo --journal postgresql://...` runs the demo to success."""

from __future__ import annotations

import subprocess
import sys

from mayfly_postgres import PostgresJournal


def test_mayfly_demo_runs_on_postgres(url: str, journal: PostgresJournal) -> None:
    """The CLI demo pipeline completes on a postgresql:// journal, and its run is listed there."""
    before = set(journal.list_runs(limit=100_000))
    result = subprocess.run(
        [sys.executable, "-m", "mayfly", "--journal", url, "demo", "--auto-approve"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "RunCompleted succeeded" in result.stdout
    (run,) = set(journal.list_runs(limit=100_000)) - before
    assert journal.read(run)[-1].event_type == "RunCompleted"


def test_mayfly_runs_lists_through_the_summary_index(url: str, journal: PostgresJournal) -> None:
    """`mayfly runs` on PostgreSQL filters by state and workflow through the indexed run summaries."""
    import json
    import os

    env = {**os.environ, "MAYFLY_DEMO_PAUSE": "0"}

    def mayfly(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mayfly", "--journal", url, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    assert mayfly("demo", "--auto-approve").returncode == 0
    parked = mayfly("--json", "demo")
    assert parked.returncode == 6, parked.stderr
    parked_run = json.loads(parked.stdout)["run_id"]
    succeeded = json.loads(
        mayfly("--json", "runs", "--state", "succeeded", "--workflow", "mayfly.demo.code-review").stdout
    )
    assert succeeded and all(row["status"] == "succeeded" for row in succeeded)
    assert parked_run not in {row["run_id"] for row in succeeded}
    running = json.loads(mayfly("--json", "runs", "--state", "running").stdout)
    assert parked_run in {row["run_id"] for row in running}
    waiting = json.loads(mayfly("--json", "runs", "--state", "waiting").stdout)
    assert [row["waiting_on"] for row in waiting if row["run_id"] == parked_run] == ["approval"]
    assert json.loads(mayfly("--json", "runs", "--workflow", "no.such.workflow").stdout) == []
