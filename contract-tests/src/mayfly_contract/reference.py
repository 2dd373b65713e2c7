"""An in-memory reference model of the journal contract, for the suite's state machine.

It implements the semantics of ``WorkflowJournal.append``/``read`` exactly
and simply, with no storage concerns, so a backend's answers can be compared
with it operation by operation. It is the suite's private oracle, not a
journal for applications.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mayfly.journal import AppendResult, JournalRecord, SnapshotRecord, validate_batch
from mayfly.model.errors import AppendConflict, ConflictingRecord, FencingRejected

__all__ = ["ReferenceJournal"]


@dataclass
class _Run:
    records: list[JournalRecord] = field(default_factory=list)
    event_ids: dict[str, int] = field(default_factory=dict)
    fence: int = 0
    snapshot: SnapshotRecord | None = None


class ReferenceJournal:
    """The contract's meaning, in memory: what every backend must answer."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    def _run(self, run_id: str) -> _Run:
        return self._runs.setdefault(run_id, _Run())

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Compare-and-append with the contract's replay, conflict and fencing rules."""
        batch = validate_batch(run_id, expected_next, records, fence)
        run = self._run(run_id)
        if (fence is None and run.fence != 0) or (fence is not None and fence != run.fence):
            raise FencingRejected(run_id, fence or 0, run.fence)
        actual_next = len(run.records) + 1
        if expected_next != actual_next:
            if all(r.sequence < actual_next and run.records[r.sequence - 1] == r for r in batch):
                return AppendResult(
                    run_id=run_id,
                    last_sequence=batch[-1].sequence,
                    records=batch,
                    already_committed=True,
                )
            for record in batch:
                used = run.event_ids.get(record.event_id)
                if used is not None and run.records[used - 1] != record:
                    raise ConflictingRecord(f"run {run_id} event id {record.event_id} reused")
            raise AppendConflict(run_id, expected_next, actual_next)
        for record in batch:
            if record.event_id in run.event_ids:
                raise ConflictingRecord(f"run {run_id} event id {record.event_id} reused")
        for record in batch:
            run.records.append(record)
            run.event_ids[record.event_id] = record.sequence
        return AppendResult(run_id=run_id, last_sequence=batch[-1].sequence, records=batch)

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Records after ``after``, at most ``limit`` of them."""
        records = self._runs[run_id].records if run_id in self._runs else []
        end = len(records) if limit is None else min(len(records), after + limit)
        return records[after:end]

    def next_sequence(self, run_id: str) -> int:
        """The next sequence of the run."""
        return len(self._runs[run_id].records) + 1 if run_id in self._runs else 1

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Replace the run's snapshot."""
        self._run(run_id).snapshot = snapshot

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """The run's snapshot, if any."""
        return self._runs[run_id].snapshot if run_id in self._runs else None
