"""Contract clause checked by hypothesis: random operation sequences agree with the reference model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from mayfly.journal import AppendResult, JournalRecord, WorkflowJournal
from mayfly.model.errors import MayflyError
from mayfly_contract.reference import ReferenceJournal
from mayfly_contract.support import Records, snapshot_of

PAYLOADS = st.text(max_size=40).map(lambda text: text.encode("utf-8"))


def outcome(call: Callable[[], object]) -> tuple[str, object]:
    """Run ``call``; return ("ok", value) or the error class name, so answers can be compared."""
    try:
        value = call()
    except MayflyError as error:
        return type(error).__name__, None
    if isinstance(value, AppendResult):
        return "ok", (value.last_sequence, value.already_committed, value.records)
    return "ok", value


def make_machine(journal: WorkflowJournal, created: set[str] | None = None) -> type[RuleBasedStateMachine]:
    """Build the state machine class bound to the journal under test (its run ids go to ``created``)."""

    class JournalMachine(RuleBasedStateMachine):
        """Append, re-append, conflict, read and snapshot on two runs, checked against the model."""

        def __init__(self) -> None:
            super().__init__()
            self.model = ReferenceJournal()
            self.records = Records(created)
            self.runs: list[str] = []

        @initialize()
        def fresh_runs(self) -> None:
            self.runs = [self.records.new_id(), self.records.new_id()]

        def both(self, operation: Callable[[Any], object]) -> None:
            expected = outcome(lambda: operation(self.model))
            actual = outcome(lambda: operation(journal))
            assert actual == expected, f"backend answered {actual}, the contract says {expected}"

        def committed(self, run: str) -> list[JournalRecord]:
            return self.model.read(run)

        @rule(which=st.integers(0, 1), count=st.integers(1, 3), payload=PAYLOADS)
        def append_next(self, which: int, count: int, payload: bytes) -> None:
            run = self.runs[which]
            first = self.model.next_sequence(run)
            batch = self.records.batch(run, first, count, payload=payload)
            self.both(lambda j: j.append(run, first, batch))

        @rule(which=st.integers(0, 1), data=st.data())
        def reappend(self, which: int, data: st.DataObject) -> None:
            run = self.runs[which]
            committed = self.committed(run)
            if not committed:
                return
            start = data.draw(st.integers(0, len(committed) - 1))
            end = data.draw(st.integers(start + 1, len(committed)))
            batch = committed[start:end]
            self.both(lambda j: j.append(run, start + 1, batch))

        @rule(which=st.integers(0, 1), shift=st.integers(-3, 3).filter(bool), count=st.integers(1, 2))
        def wrong_expected(self, which: int, shift: int, count: int) -> None:
            run = self.runs[which]
            expected = max(1, self.model.next_sequence(run) + shift)
            batch = self.records.batch(run, expected, count)
            self.both(lambda j: j.append(run, expected, batch))

        @rule(which=st.integers(0, 1), data=st.data())
        def reuse_event_id(self, which: int, data: st.DataObject) -> None:
            run = self.runs[which]
            committed = self.committed(run)
            if not committed:
                return
            victim = data.draw(st.sampled_from(committed))
            at = self.model.next_sequence(run)
            batch = [self.records.record(run, at, event_id=victim.event_id, payload=b'"x"')]
            self.both(lambda j: j.append(run, at, batch))

        @rule(which=st.integers(0, 1), after=st.integers(0, 12), limit=st.none() | st.integers(0, 5))
        def read(self, which: int, after: int, limit: int | None) -> None:
            run = self.runs[which]
            self.both(lambda j: list(j.read(run, after=after, limit=limit)))

        @precondition(lambda self: bool(self.runs))
        @rule(which=st.integers(0, 1), data=st.data())
        def snapshot(self, which: int, data: st.DataObject) -> None:
            run = self.runs[which]
            committed = self.committed(run)
            if not committed or not journal.capabilities.snapshots:
                return
            snap = snapshot_of(data.draw(st.sampled_from(committed)))
            self.both(lambda j: j.write_snapshot(run, snap))
            self.both(lambda j: j.read_snapshot(run))

        @invariant()
        def next_sequences_agree(self) -> None:
            for run in self.runs:
                assert journal.next_sequence(run) == self.model.next_sequence(run)

    return JournalMachine


@pytest.mark.clause("journal.model.state-machine")
def test_random_operation_sequences_match_the_reference_model(
    mayfly_journal: WorkflowJournal, mayfly_probe_runs: set[str]
) -> None:
    """Random sequences of appends, replays, conflicts, reads and snapshots match the reference model."""
    run_state_machine_as_test(
        make_machine(mayfly_journal, mayfly_probe_runs),
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
