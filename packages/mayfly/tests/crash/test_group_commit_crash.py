"""SIGKILL between a group flush and its acknowledgements: every acknowledged record survives, nothing doubles.

A child process drives 16 runs at once on one hub (``group_crash_worker.py``),
so their appends meet in group flushes, and kills itself with SIGKILL right
after the K-th group flush returned, before any of its callers was woken
(``MAYFLY_TEST_KILL_AFTER_GROUP_FLUSH``). A second process resumes every run
and finishes it. Then: every record acknowledged before the kill (the child's
fsynced side file) is in the journal at its sequence, each node's outcome is
committed exactly once, and every run succeeded.
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

WORKER = Path(__file__).with_name("group_crash_worker.py")
RUNS = 16


def run_worker(
    url: str, tmp_path: Path, mode: str, kill_after: int | None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(KILL_AFTER_ENV, None)
    if kill_after is not None:
        env[KILL_AFTER_ENV] = str(kill_after)
    return subprocess.run(
        [sys.executable, str(WORKER), url, str(tmp_path / "runs"), str(tmp_path / "acks"), mode, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def kill_in_a_group_flush_then_resume(url: str, tmp_path: Path, kill_after: int) -> None:
    """The whole check, for any journal URL whose appends go through a group commit."""
    ids = Uuid7IdSource()
    runs = [ids.new_id() for _ in range(RUNS)]
    (tmp_path / "runs").write_text("\n".join(runs) + "\n")

    crashed = run_worker(url, tmp_path, "create", kill_after)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    acked: dict[tuple[str, int], str] = {}
    for line in (tmp_path / "acks").read_text().splitlines():
        _, run_id, sequence, event_id = line.split()
        acked[run_id, int(sequence)] = event_id
    # The first group flush holds the runs' creations: killed there, nothing was acknowledged yet.
    assert acked or kill_after == 1, "the child was killed before any acknowledgement"

    journal = open_journal(url)
    try:
        before = {run_id: journal.read(run_id) for run_id in runs}
    finally:
        journal.close()
    for (run_id, sequence), event_id in acked.items():
        records = before[run_id]
        assert len(records) >= sequence, f"acknowledged record {run_id}#{sequence} was lost"
        assert records[sequence - 1].event_id == event_id

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


@pytest.mark.parametrize("kill_after", [1, 4, 15])
def test_file_journal_sigkill_between_group_flush_and_acks(tmp_path: Path, kill_after: int) -> None:
    """The file journal in fsync mode: the group's frames are synced before the kill, and none was acknowledged."""
    kill_in_a_group_flush_then_resume(f"file://{tmp_path}/journal?durability=fsync", tmp_path, kill_after)
