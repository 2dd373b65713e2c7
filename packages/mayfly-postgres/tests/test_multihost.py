"""Many runtime processes sharing runs: one owner per run, no duplicate outcome, stale owners fenced."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hostworker import chain
from pgserver import IDS

from mayfly.commit import commit_command
from mayfly.journal import JournalRecord
from mayfly.model.commands import CreateRun
from mayfly.model.errors import LeaseHeld
from mayfly.model.events import NodeOutcomeCommitted, RunCompleted
from mayfly.reducer import decode_event
from mayfly_postgres import PostgresJournal, PostgresLeaseStore

WORKER = Path(__file__).with_name("hostworker.py")


def spawn_worker(*arguments: str) -> subprocess.Popen[str]:
    """Start a hostworker process with line-buffered pipes."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def events(journal: PostgresJournal, run: str) -> list[Any]:
    """The run's decoded events."""
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run)]


def test_racing_recoverers_give_each_run_exactly_one_owner(journal: PostgresJournal, url: str) -> None:
    """Four processes with different owners race to resume 12 runs: each run is driven by exactly one."""
    runs = []
    for _ in range(12):
        run = IDS.new_id()
        commit_command(journal, None, CreateRun(run_id=run, spec=chain(5)), ids=IDS)
        runs.append(run)
    workers = [spawn_worker("recover", url, f"host-{n}", *runs) for n in range(4)]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert [worker.returncode for worker in workers] == [0] * 4, [err for _, err in outputs]
    for run in runs:
        history = events(journal, run)
        outcomes = [e for e in history if isinstance(e, NodeOutcomeCommitted)]
        counted = collections.Counter(e.node_id for e in outcomes)
        assert counted == {f"n{i}": 1 for i in range(5)}, f"run {run}: {counted}"
        owners = {e.outcome.output["owner"] for e in outcomes}
        assert len(owners) == 1, f"run {run} was driven by {owners}"
        assert sum(isinstance(e, RunCompleted) for e in history) == 1
        assert sum(f"drove {run} succeeded" in out for out, _ in outputs) >= 1


def test_paused_then_revived_owner_cannot_append(
    journal: PostgresJournal, leases: PostgresLeaseStore
) -> None:
    """An owner frozen (SIGSTOP) past its lease, revived after a takeover, is fenced and loses the lease."""
    run = IDS.new_id()
    worker = spawn_worker("stale", journal.url, run)
    try:
        assert worker.stdout is not None and worker.stdin is not None
        held, token = worker.stdout.readline().split()
        assert held == "held"
        os.kill(worker.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while True:
            try:
                guard = leases.acquire(run, "new-owner", 60_000)
                break
            except LeaseHeld:
                assert time.monotonic() < deadline, "the frozen owner's lease never expired"
                time.sleep(0.1)
        journal.append(run, 1, [new_owner_record(run)], fence=guard.fencing_token)
        os.kill(worker.pid, signal.SIGCONT)
        worker.stdin.write("append\n")
        worker.stdin.flush()
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.split() == ["fenced", str(guard.fencing_token), "lost"]
        assert guard.fencing_token > int(token)
        assert [r.event_type for r in journal.read(run)] == ["NewOwnerWrite"]
        guard.release()
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.communicate(timeout=30)


def new_owner_record(run: str) -> JournalRecord:
    """One record written by the new owner."""
    return JournalRecord.seal(
        run_id=run,
        sequence=1,
        event_id=IDS.new_id(),
        event_type="NewOwnerWrite",
        schema_version=1,
        payload=b"{}",
    )
