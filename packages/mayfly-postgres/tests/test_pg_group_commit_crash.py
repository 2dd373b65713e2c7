"""SIGKILL between a PostgreSQL group transaction and its acknowledgements: every acknowledged record survives.

The core's crash worker (``packages/mayfly/tests/crash/group_crash_worker.py``)
drives 16 runs at once on one hub against this session's schema; the process
kills itself right after the K-th group flush of two or more appends (one
transaction, committed) returned, before any caller is woken. A second process
resumes every run and finishes it; every acknowledged record is where it was
acknowledged, each node's outcome is committed once, every run succeeded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.model.events import NodeOutcomeCommitted
from mayfly.model.state import RunStatus
from mayfly.plugins import open_journal
from mayfly.recovery import replay_run
from mayfly.reducer import decode_event
from mayfly.substrate._group import KILL_AFTER_ENV

WORKER = Path(__file__).parents[2] / "mayfly" / "tests" / "crash" / "group_crash_worker.py"
RUNS = 16


def run_worker(
    url: str, tmp_path: Path, mode: str, kill_after: int | None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(KILL_AFTER_ENV, None)
    if kill_after is not None:
        env[KILL_AFTER_ENV] = str(kill_after)
    return subprocess.run(
        [
            sys.executable,
            str(WORKER),
            url,
            str(tmp_path / "runs"),
            str(tmp_path / "acks"),
            mode,
            mode,
            "1500",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("kill_after", [1, 4, 15])
def test_postgres_sigkill_between_group_commit_and_acks(url: str, tmp_path: Path, kill_after: int) -> None:
    """The committed transaction survives the kill; none of it was acknowledged; resuming finishes every run."""
    ids = Uuid7IdSource()
    runs = [ids.new_id() for _ in range(RUNS)]
    (tmp_path / "runs").write_text("\n".join(runs) + "\n")

    crashed = run_worker(url, tmp_path, "create", kill_after)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    acked: dict[tuple[str, int], str] = {}
    for line in (tmp_path / "acks").read_text().splitlines():
        _, run_id, sequence, event_id = line.split()
        acked[run_id, int(sequence)] = event_id
    assert acked or kill_after == 1, "the child was killed before any acknowledgement"

    journal = open_journal(url)
    try:
        before = {run_id: journal.read(run_id) for run_id in runs}
    finally:
        journal.close()
    for (run_id, sequence), event_id in acked.items():
        assert len(before[run_id]) >= sequence, f"acknowledged record {run_id}#{sequence} was lost"
        assert before[run_id][sequence - 1].event_id == event_id

    resumed = run_worker(url, tmp_path, "resume", None)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # A run whose creation was still queued at the kill was never committed, nor acknowledged.
    expected = [f"done {run_id} {'succeeded' if before[run_id] else 'absent'}" for run_id in runs]
    assert sorted(resumed.stdout.split("\n")[:-1]) == sorted(expected)
    assert sum(1 for run_id in runs if before[run_id]) >= 2  # the fatal flush held two or more

    journal = open_journal(url)
    try:
        for run_id in runs:
            if not before[run_id]:
                assert journal.read(run_id) == []
                continue
            records = journal.read(run_id)
            assert [r.sequence for r in records] == list(range(1, len(records) + 1))
            assert len({r.event_id for r in records}) == len(records)
            assert [r.event_id for r in records[: len(before[run_id])]] == [
                r.event_id for r in before[run_id]
            ]
            outcomes: dict[str, int] = {}
            for record in records:
                event = decode_event(record.event_type, record.schema_version, record.payload)
                if isinstance(event, NodeOutcomeCommitted):
                    outcomes[event.node_id] = outcomes.get(event.node_id, 0) + 1
            assert outcomes == {f"n{i}": 1 for i in range(12)}
            assert replay_run(journal, run_id).state.status is RunStatus.SUCCEEDED
    finally:
        journal.close()
