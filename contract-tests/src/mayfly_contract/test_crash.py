"""Contract clause of crash durability: an acknowledged record survives SIGKILL of its writer."""

from __future__ import annotations

import json

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.plugins import open_journal
from mayfly_contract.support import Child, Records, sequences


@pytest.mark.clause("journal.crash.sigkill-after-ack")
@pytest.mark.capability("crash_durable")
@pytest.mark.parametrize("acks", [1, 7, 40])
def test_acknowledged_records_survive_sigkill(
    mayfly_journal_url: str, run_id: str, records: Records, acks: int
) -> None:
    """A writer killed right after an ack loses nothing acknowledged; the run stays appendable."""
    child = Child("append-until-killed", url=mayfly_journal_url, run_id=run_id)
    lines: list[str] = []
    try:
        lines.extend(child.readline() for _ in range(acks))
        lines.extend(child.kill())  # most likely in the middle of its next append
    finally:
        child.close()
    acknowledged: list[tuple[int, str]] = []
    for line in lines:
        assert line.startswith("ack "), line
        acknowledged.extend((seq, event) for seq, event in json.loads(line[4:]))
    journal: WorkflowJournal = open_journal(mayfly_journal_url)
    try:
        stored = list(journal.read(run_id))
        assert sequences(stored) == list(range(1, len(stored) + 1))
        assert [(r.sequence, r.event_id) for r in stored[: len(acknowledged)]] == acknowledged
        # Beyond the acknowledged records there is nothing, or the whole next batch (committed
        # but killed before its ack was printed): never part of a batch.
        next_batch = 1 + len(lines) % 3
        assert len(stored) - len(acknowledged) in (0, next_batch)
        next_sequence = journal.next_sequence(run_id)
        assert next_sequence == len(stored) + 1
        journal.append(run_id, next_sequence, records.batch(run_id, next_sequence, 2))
        assert sequences(journal.read(run_id, after=next_sequence - 1)) == [
            next_sequence,
            next_sequence + 1,
        ]
    finally:
        journal.close()
