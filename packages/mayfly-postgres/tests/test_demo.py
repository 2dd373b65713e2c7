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
