"""inspect_runs: many runs inspected together rebuild exactly what inspect_run rebuilds one by one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from conftest import node, workflow

from mayfly.commit import commit_command
from mayfly.journal import RUN_TAILS, JournalFaults, SnapshotRecord, WorkflowJournal
from mayfly.local import LocalWorkflowJournal
from mayfly.model.commands import AdvanceTime, AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.errors import CorruptionError, HistoryLost, JournalGap, MayflyError, RunNotFound
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.outcomes import RetryableFailure, Succeeded
from mayfly.model.state import RunState
from mayfly.recovery import RecoveredRun, inspect_run, inspect_runs
from mayfly.snapshot import make_snapshot
from mayfly.testing import MemoryStore

SPEC = workflow(node("a"), node("b"), node("c", "a"))


class Runs:
    """Runs in every shape recovery meets, on one journal."""

    def __init__(self, journal: WorkflowJournal) -> None:
        self.journal = journal
        self.ids = DeterministicIdSource(11)

    def run(self) -> tuple[str, RunState]:
        run_id = self.ids.new_id()
        state = commit_command(self.journal, None, CreateRun(run_id=run_id, spec=SPEC), ids=self.ids).state
        first, second = self.ids.new_id(), self.ids.new_id()
        for command in (
            StartNodes((AttemptStart("a", first), AttemptStart("b", second))),
            AdvanceTime(10),
            CompleteAttempt("a", first, Succeeded()),
            CompleteAttempt("b", second, RetryableFailure(reason="x")),
        ):
            state = commit_command(self.journal, state, command, ids=self.ids).state
        return run_id, state

    def snapshot(self, run_id: str, state: RunState) -> SnapshotRecord:
        snapshot = make_snapshot(state, self.journal.read(run_id)[-1])
        self.journal.write_snapshot(run_id, snapshot)
        return snapshot


@pytest.fixture(params=["file", "memory"])
def runs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runs]:
    """A file journal (no run_tails: read run by run) and a memory one (run_tails, the kit's default)."""
    if request.param == "file":
        journal: WorkflowJournal = LocalWorkflowJournal(f"file://{tmp_path}/store?durability=write")
    else:
        journal = MemoryStore().journal()
    assert (RUN_TAILS.of(journal) is not None) == (request.param == "memory")
    yield Runs(journal)
    journal.close()


def _same(together: object, alone: Callable[[], RecoveredRun]) -> None:
    """``together`` is what ``alone()`` returns, or the error of the same type it raises."""
    try:
        expected = alone()
    except MayflyError as error:
        assert type(together) is type(error), (together, error)
        return
    assert isinstance(together, RecoveredRun), together
    assert together.state.to_record() == expected.state.to_record()
    assert (together.source, together.records_reduced, together.last_record, together.diagnostics) == (
        expected.source,
        expected.records_reduced,
        expected.last_record,
        expected.diagnostics,
    )


def test_every_shape_of_run_reads_together_as_it_reads_alone(runs: Runs) -> None:
    """No snapshot, a current one with a tail, a corrupt one, a stale one, one ahead of the journal
    (lost history), a damaged record and an unknown run: each comes back as inspect_run has it."""
    journal = runs.journal
    assert isinstance(journal, JournalFaults)
    plain, _ = runs.run()
    current, state = runs.run()
    runs.snapshot(current, state)
    commit_command(journal, state, AdvanceTime(20), ids=runs.ids)  # a tail after the snapshot
    corrupt, state = runs.run()
    runs.snapshot(corrupt, state)
    journal.corrupt_snapshot(corrupt)
    stale, _ = runs.run()
    other, other_state = runs.run()
    wrong = msgspec.structs.asdict(make_snapshot(other_state, journal.read(other)[-1]))
    del wrong["checksum"]
    journal.write_snapshot(stale, SnapshotRecord.seal(**{**wrong, "run_id": stale}))
    ahead, state = runs.run()
    runs.snapshot(ahead, state)
    journal.remove_record(ahead, state.sequence)
    damaged, _ = runs.run()
    journal.corrupt_record(damaged, 3)
    unknown = runs.ids.new_id()
    order = [plain, current, corrupt, stale, other, ahead, damaged, unknown]
    together = inspect_runs(journal, order)
    assert len(together) == len(order)
    for run_id, found in zip(order, together, strict=True):
        _same(found, lambda run_id=run_id: inspect_run(journal, run_id))
    shapes = dict(zip(order, together, strict=True))
    assert isinstance(shapes[current], RecoveredRun) and shapes[current].source == "snapshot"
    # The file journal shrinks to the records it holds (history lost); the memory one keeps its head (a gap).
    assert isinstance(shapes[ahead], HistoryLost | JournalGap)
    assert isinstance(shapes[damaged], CorruptionError)
    assert isinstance(shapes[unknown], RunNotFound)


def test_no_runs_is_no_reads(runs: Runs) -> None:
    """An empty list of runs inspects nothing."""
    assert inspect_runs(runs.journal, []) == []
