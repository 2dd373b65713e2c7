"""commit_command: decide, append, verify the acknowledgement, and only then reduce."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import node, workflow

from mayfly.commit import commit_command
from mayfly.journal import AppendResult, JournalCapabilities, JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.errors import AppendConflict, CommandRejected, CorruptionError, FencingRejected
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.outcomes import Succeeded
from mayfly.model.state import RunStatus
from mayfly.recovery import replay_run

SPEC = workflow(node("a"), node("b", "a"))


@pytest.fixture
def journal(tmp_path: Path) -> LocalWorkflowJournal:
    return LocalWorkflowJournal(f"file://{tmp_path}/journal?durability=write")


def test_committed_events_are_durable_before_state_is_exposed(journal: LocalWorkflowJournal) -> None:
    """Every event of a committed command is in the journal, in order, when the commit returns."""
    ids = DeterministicIdSource(1)
    run_id = ids.new_id()
    commit = commit_command(journal, None, CreateRun(run_id=run_id, spec=SPEC), ids=ids)
    assert [r.sequence for r in journal.read(run_id)] == [1, 2]
    assert [r.event_type for r in commit.records] == ["RunCreated", "NodeReady"]
    state = commit.state
    attempt = ids.new_id()
    commit_command(journal, state, StartNodes((AttemptStart("a", attempt),)), ids=ids)
    commit = commit_command(journal, state, CompleteAttempt("a", attempt, Succeeded()), ids=ids)
    assert commit.state is state and state.sequence == 5
    assert replay_run(journal, run_id).state.to_record() == state.to_record()


def test_a_rejected_command_writes_nothing(journal: LocalWorkflowJournal) -> None:
    """decide's rejection is raised as CommandRejected and the journal is unchanged."""
    ids = DeterministicIdSource(2)
    run_id = ids.new_id()
    state = commit_command(journal, None, CreateRun(run_id=run_id, spec=SPEC), ids=ids).state
    with pytest.raises(CommandRejected, match="not ready"):
        commit_command(journal, state, StartNodes((AttemptStart("b", ids.new_id()),)), ids=ids)
    assert journal.next_sequence(run_id) == 3


def test_a_concurrent_writer_makes_the_append_conflict_and_state_untouched(
    journal: LocalWorkflowJournal,
) -> None:
    """If another owner appended first, compare-and-append fails and the caller's state is unchanged."""
    ids = DeterministicIdSource(3)
    run_id = ids.new_id()
    state = commit_command(journal, None, CreateRun(run_id=run_id, spec=SPEC), ids=ids).state
    other = replay_run(journal, run_id).state
    commit_command(journal, other, StartNodes((AttemptStart("a", ids.new_id()),)), ids=ids)
    before = state.to_record()
    with pytest.raises(AppendConflict, match="expected next sequence 3, journal is at 4"):
        commit_command(journal, state, StartNodes((AttemptStart("a", ids.new_id()),)), ids=ids)
    assert state.to_record() == before


def test_appends_carry_the_fencing_token(tmp_path: Path) -> None:
    """Once a lease was granted, an append with a stale or missing token is rejected."""
    url = f"file://{tmp_path}/fenced?durability=write"
    journal, leases = LocalWorkflowJournal(url), LocalLeaseStore(url)
    ids = DeterministicIdSource(4)
    run_id = ids.new_id()
    state = commit_command(journal, None, CreateRun(run_id=run_id, spec=SPEC), ids=ids).state
    with leases.acquire(run_id, "owner-1", 30_000) as first:
        old = first.fencing_token
    with leases.acquire(run_id, "owner-2", 30_000) as second:
        start = StartNodes((AttemptStart("a", ids.new_id()),))
        with pytest.raises(FencingRejected):
            commit_command(journal, state, start, ids=ids, fence=old)
        with pytest.raises(FencingRejected):
            commit_command(journal, state, start, ids=ids, fence=None)
        commit_command(journal, state, start, ids=ids, fence=second.fencing_token)
    assert state.status is RunStatus.RUNNING and state.sequence == 3


class _LyingJournal:
    """A journal that acknowledges something other than what it was given."""

    def __init__(self, inner: LocalWorkflowJournal) -> None:
        self.inner = inner
        self.url = "lying://"
        # A plain journal: it keeps no run index, so commit_command uses append.
        self.capabilities = JournalCapabilities.declare(
            inner.durability, "cross_process fencing crash_durable"
        )

    def append(
        self, run_id: str, expected_next: int, records: Sequence[JournalRecord], fence: int | None = None
    ) -> AppendResult:
        result = self.inner.append(run_id, expected_next, records, fence)
        return AppendResult(run_id=run_id, last_sequence=result.last_sequence, records=result.records[:-1])


def test_an_acknowledgement_that_differs_from_the_batch_is_corruption(journal: LocalWorkflowJournal) -> None:
    """commit_command refuses to expose state when the backend acknowledged other records."""
    ids = DeterministicIdSource(5)
    with pytest.raises(CorruptionError, match="acknowledged a different batch"):
        commit_command(
            _LyingJournal(journal),  # type: ignore[arg-type]
            None,
            CreateRun(run_id=ids.new_id(), spec=SPEC),
            ids=ids,
        )
