"""A process killed with SIGKILL mid-run is resumed by a new process with nothing lost or duplicated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.local import LocalWorkflowJournal
from mayfly.model.events import NodeOutcomeCommitted
from mayfly.model.state import RunStatus
from mayfly.recovery import replay_run
from mayfly.reducer import decode_event

WORKER = Path(__file__).with_name("crash_worker.py")


def spawn(url: str, run_id: str, mode: str, owner: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, run_id, mode, owner],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("kill_after", [1, 7, 30])
def test_sigkill_then_resume_in_a_new_process(tmp_path: Path, kill_after: int) -> None:
    """Every acknowledged record survives SIGKILL; the resumer reconciles the in-flight attempt and finishes."""
    url = f"file://{tmp_path}/journal?durability=fsync"
    run_id = Uuid7IdSource().new_id()
    worker = spawn(url, run_id, "create", "first")
    acked: dict[int, str] = {}
    assert worker.stdout is not None
    for line in worker.stdout:
        _, sequence, event_id = line.split()
        acked[int(sequence)] = event_id
        if len(acked) >= kill_after:
            os.kill(worker.pid, signal.SIGKILL)
            break
    worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL

    resumer = spawn(url, run_id, "resume", "second")
    out, err = resumer.communicate(timeout=120)
    assert resumer.returncode == 0, err
    assert out.splitlines()[-1] == "done succeeded"

    journal = LocalWorkflowJournal(url)
    records = journal.read(run_id)
    assert [r.sequence for r in records] == list(range(1, len(records) + 1))
    assert len({r.event_id for r in records}) == len(records)
    for sequence, event_id in acked.items():
        assert records[sequence - 1].event_id == event_id
    outcomes: dict[str, int] = {}
    for record in records:
        event = decode_event(record.event_type, record.schema_version, record.payload)
        if isinstance(event, NodeOutcomeCommitted):
            outcomes[event.node_id] = outcomes.get(event.node_id, 0) + 1
    assert outcomes == {f"n{i}": 1 for i in range(40)}
    assert replay_run(journal, run_id).state.status is RunStatus.SUCCEEDED
