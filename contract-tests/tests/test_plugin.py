"""The contract suite's plugin run as a user runs it: the report, and probe runs purged from the store."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from mayfly.plugins import open_journal


def certify(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run part of the suite against ``url`` in its own pytest process."""
    tripwire = ["-p", "asyncio_tripwire"] if importlib.util.find_spec("asyncio_tripwire") else []
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tripwire]
    return subprocess.run(
        [*command, "--pyargs", "mayfly_contract", "--mayfly-journal", url, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_probe_runs_are_purged_when_the_session_ends(tmp_path: Path) -> None:
    """After a certification run the store lists no probe run, and the report says how many were purged."""
    url = f"file://{tmp_path}/store?durability=write"
    completed = certify(url, "-k", "test_append or test_read or test_snapshots or test_resume")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    report = completed.stdout[completed.stdout.find("mayfly contract certification") :]
    purged = [line for line in report.splitlines() if line.startswith("probe runs: ")]
    assert len(purged) == 1 and purged[0].endswith("probe runs purged from the store"), report
    assert int(purged[0].split()[2]) > 10
    with open_journal(url) as journal:
        assert journal.list_runs() == []


def test_probe_runs_can_be_kept_on_purpose(tmp_path: Path) -> None:
    """--mayfly-keep-probe-runs leaves the runs in the store and the report says so."""
    url = f"file://{tmp_path}/store?durability=write"
    completed = certify(url, "-k", "test_read", "--mayfly-keep-probe-runs")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "left in the store (--mayfly-keep-probe-runs was given)" in completed.stdout
    with open_journal(url) as journal:
        assert journal.list_runs() != []
