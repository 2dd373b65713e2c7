"""The file journal keeps a run's file and fencing counter open across appends, and that stays safe.

Keeping the descriptors saves system calls on every append; these tests pin
what must not change because of it: a run file removed from outside fails
closed instead of taking appends into a file nobody can read, a forked child
does not share the parent's ``flock`` (which would let both append at once),
a lease granted meanwhile is still seen by the next append, and the kept
descriptors are bounded.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.errors import AppendConflict, FencingRejected, HistoryLost

IDS = Uuid7IdSource()


def sealed(run: str, sequence: int) -> JournalRecord:
    return JournalRecord.seal(
        run_id=run,
        sequence=sequence,
        event_id=IDS.new_id(),
        event_type="Tested",
        schema_version=1,
        payload=json.dumps({"n": sequence}).encode(),
    )


def test_a_run_file_removed_while_kept_open_fails_closed(tmp_path: Path) -> None:
    """An append after the run's file was deleted raises HistoryLost; nothing is acknowledged into it."""
    journal = LocalWorkflowJournal(f"file://{tmp_path}/store?durability=write")
    run = IDS.new_id()
    journal.append(run, 1, [sealed(run, 1)])
    os.unlink(tmp_path / "store" / "runs" / f"{run}.mwj")
    with pytest.raises(HistoryLost, match="removed while this process had it open"):
        journal.append(run, 2, [sealed(run, 2)])
    # The kept descriptor was dropped: the next append opens the path, finds no history there and
    # refuses a batch that does not start the run.
    with pytest.raises(AppendConflict):
        journal.append(run, 2, [sealed(run, 2)])
    assert journal.next_sequence(run) == 1


def test_a_forked_child_does_not_share_the_parents_file_lock(tmp_path: Path) -> None:
    """A child's append waits for the parent's exclusive lock on the run file it kept open before the fork."""
    url = f"file://{tmp_path}/store?durability=write"
    journal = LocalWorkflowJournal(url)
    run = IDS.new_id()
    journal.append(run, 1, [sealed(run, 1)])
    done = tmp_path / "child-appended"
    # Hold the run's exclusive lock through the very descriptor the journal kept.
    kept = journal._files[run]
    fcntl.flock(kept, fcntl.LOCK_EX)
    pid = os.fork()
    if pid == 0:  # the child: append through the journal object it inherited
        code = 1
        try:
            journal.append(run, 2, [sealed(run, 2)])
            done.write_text("yes")
            code = 0
        finally:
            os._exit(code)
    try:
        time.sleep(0.5)
        assert not done.exists(), "the child appended while the parent held the run's lock"
    finally:
        fcntl.flock(kept, fcntl.LOCK_UN)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert done.read_text() == "yes"
    assert LocalWorkflowJournal(url).next_sequence(run) == 3


def test_a_lease_granted_after_the_counter_was_kept_open_fences_the_next_append(tmp_path: Path) -> None:
    """The kept fencing counter sees a newer grant: the old token is refused, the new one accepted."""
    url = f"file://{tmp_path}/store?durability=write"
    journal = LocalWorkflowJournal(url)
    leases = LocalLeaseStore(url)
    run = IDS.new_id()
    first = leases.acquire(run, "first", 60_000)
    journal.append(run, 1, [sealed(run, 1)], first.fencing_token)
    first.release()
    second = LocalLeaseStore(url).acquire(run, "second", 60_000)
    assert second.fencing_token > first.fencing_token
    with pytest.raises(FencingRejected):
        journal.append(run, 2, [sealed(run, 2)], first.fencing_token)
    journal.append(run, 2, [sealed(run, 2)], second.fencing_token)
    second.release()


def test_kept_descriptors_are_bounded(tmp_path: Path) -> None:
    """Appending to many runs keeps at most a bounded number of files open."""
    journal = LocalWorkflowJournal(f"file://{tmp_path}/store?durability=write")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(400):
        run = IDS.new_id()
        journal.append(run, 1, [sealed(run, 1)])
    assert len(os.listdir("/proc/self/fd")) - before <= 200
    journal.close()
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # the run index's database may stay open
