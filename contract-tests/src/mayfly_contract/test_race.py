"""Contract clause of concurrent writers: N processes racing compare-and-append on one run."""

from __future__ import annotations

import json

import pytest

from mayfly.journal import WorkflowJournal
from mayfly_contract.support import Child

WRITERS = 4
WINS_PER_WRITER = 12


@pytest.mark.clause("journal.race.n-writers")
@pytest.mark.capability("cross_process")
@pytest.mark.parametrize("batch", [1, 3])
def test_racing_processes_lose_nothing_and_duplicate_nothing(
    mayfly_journal: WorkflowJournal, mayfly_journal_url: str, run_id: str, batch: int
) -> None:
    """Racing writers: every acknowledged record is stored once, each sequence has exactly one winner."""
    children = [
        Child("race", url=mayfly_journal_url, run_id=run_id, wins=WINS_PER_WRITER, batch=batch)
        for _ in range(WRITERS)
    ]
    try:
        for child in children:
            assert child.readline() == "ready"
        for child in children:
            child.send("go")
        results = [json.loads(child.finish()[-1]) for child in children]
    finally:
        for child in children:
            child.close()
    won = [(seq, event) for result in results for seq, event in result["won"]]
    total = WRITERS * WINS_PER_WRITER * batch
    assert len(won) == total
    assert sorted(seq for seq, _ in won) == list(range(1, total + 1)), "one winner per sequence"
    stored = list(mayfly_journal.read(run_id))
    assert [(r.sequence, r.event_id) for r in stored] == sorted(won)
    assert len({r.event_id for r in stored}) == total
    assert mayfly_journal.next_sequence(run_id) == total + 1
