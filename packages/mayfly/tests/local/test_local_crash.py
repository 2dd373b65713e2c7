"""Crash tests of the local journal: real writer processes SIGKILLed in the middle of big batches."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.journal import MAX_RECORD_PAYLOAD, JournalRecord
from mayfly.local import LocalWorkflowJournal

IDS = Uuid7IdSource()

# Each batch is three records of ~0.4 MiB, so a kill often lands inside the write of a batch.
WRITER = """
import json, sys
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalWorkflowJournal

url, run = sys.argv[1], sys.argv[2]
ids = Uuid7IdSource()
journal = LocalWorkflowJournal(url)
body = b'"' + b"x" * 400_000 + b'"'
while True:
    first = journal.next_sequence(run)
    batch = [
        JournalRecord.seal(run_id=run, sequence=first + i, event_id=ids.new_id(),
                           event_type="Big", schema_version=1, payload=body)
        for i in range(3)
    ]
    journal.append(run, first, batch)
    sys.stdout.write(json.dumps([r.event_id for r in batch]) + "\\n")
    sys.stdout.flush()
"""


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_sigkill_mid_batch_never_leaves_part_of_a_batch(tmp_path: Path, durability: str) -> None:
    """Killing writers mid-append over and over loses no acknowledged batch and never keeps half of one."""
    url = f"file://{tmp_path}?durability={durability}"
    run = IDS.new_id()
    acknowledged: list[str] = []
    for round_number in range(12):
        child = subprocess.Popen([sys.executable, "-c", WRITER, url, run], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        for _ in range(1 + round_number % 3):
            line = child.stdout.readline()
            assert line, "writer died before acknowledging"
            acknowledged.extend(json.loads(line))
        # Spread the kill over the next append: about a third of these land inside its write.
        time.sleep(0.0015 * round_number)
        child.kill()
        child.wait()
        acknowledged.extend(event for line in child.stdout.read().splitlines() for event in json.loads(line))
        child.stdout.close()
        with LocalWorkflowJournal(url) as journal:
            stored = journal.read(run)
            assert [r.sequence for r in stored] == list(range(1, len(stored) + 1))
            assert [r.event_id for r in stored[: len(acknowledged)]] == acknowledged
            assert len(stored) - len(acknowledged) in (0, 3), "a batch was kept in part"
            # Whatever the kill left behind, the next writer continues from a committed batch.
            acknowledged = [r.event_id for r in stored]
    assert MAX_RECORD_PAYLOAD > 400_002
    with LocalWorkflowJournal(url) as journal:
        next_sequence = journal.next_sequence(run)
        record = JournalRecord.seal(
            run_id=run,
            sequence=next_sequence,
            event_id=IDS.new_id(),
            event_type="After",
            schema_version=1,
            payload=b"{}",
        )
        journal.append(run, next_sequence, [record])
        assert journal.read(run, after=next_sequence - 1) == [record]
