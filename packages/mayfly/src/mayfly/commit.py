"""``commit_command``: the decide → append → verify → reduce boundary (ADR-0032 Story 1.6).

New state and effects are exposed only after the journal acknowledged exactly
the records that were decided. Until then the caller's state is untouched, so
a rejected command, a conflicting append or an unreachable store leaves
nothing half-applied in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard, final

from mayfly.journal import AppendResult, JournalRecord, WorkflowJournal
from mayfly.model.commands import Command, CreateRun, Rejection
from mayfly.model.errors import CommandRejected, CorruptionError
from mayfly.model.events import Event
from mayfly.model.ids import IdSource
from mayfly.model.state import RunState
from mayfly.reducer import encode_event, reduce
from mayfly.reducer._draft import Draft
from mayfly.reducer.decide import decide_draft
from mayfly.runindex import RUN_INDEX, IndexEntry, RunIndexJournal, index_entry

__all__ = ["Commit", "commit_command", "keeps_run_index", "seal_events"]


@final
class Commit:
    """What one committed command produced: its events, their records, and the new state."""

    __slots__ = ("events", "records", "state")

    def __init__(
        self, state: RunState, events: tuple[Event, ...], records: tuple[JournalRecord, ...]
    ) -> None:
        self.state = state
        self.events = events
        self.records = records

    @property
    def last_sequence(self) -> int:
        """The sequence of the last committed record (the state's sequence)."""
        return self.state.sequence


def seal_events(
    run_id: str, first_sequence: int, events: Sequence[Event], ids: IdSource
) -> list[JournalRecord]:
    """Encode ``events`` as sealed journal records numbered from ``first_sequence``."""
    records = []
    for offset, event in enumerate(events):
        encoded = encode_event(event)
        records.append(
            JournalRecord.seal(
                run_id=run_id,
                sequence=first_sequence + offset,
                event_id=ids.new_id(),
                event_type=encoded.event_type,
                schema_version=encoded.schema_version,
                payload=encoded.payload,
            )
        )
    return records


def commit_command(
    journal: WorkflowJournal,
    state: RunState | None,
    command: Command,
    *,
    ids: IdSource,
    fence: int | None = None,
) -> Commit:
    """Decide ``command``, append its events atomically, verify the acknowledgement, then apply them.

    ``state`` is the run's current state (``None`` only for :class:`CreateRun`)
    and is updated in place once the append is acknowledged (it takes the
    results of the draft the batch was decided on, equal to reducing the
    batch: :meth:`~mayfly.reducer._draft.Draft.settle`); the returned
    :class:`Commit` holds it. A rejected command raises
    :class:`CommandRejected` with nothing written. Journal errors
    (``AppendConflict``, ``FencingRejected``, ``JournalUnavailable``...) propagate
    with the state untouched; after an error that leaves the outcome unknown
    (``JournalUnavailable``) the caller reloads the run from the journal
    before deciding again. An acknowledgement that does not match the decided
    records exactly is a :class:`CorruptionError`. A journal that keeps the
    run index receives the run's new :class:`~mayfly.runindex.IndexEntry`
    with the records (:meth:`~mayfly.runindex.RunIndexJournal.append_indexed`),
    read off the draft of the decision, so asking for it changes nothing.
    """
    decided = decide_draft(state, command)
    if isinstance(decided, Rejection):
        raise CommandRejected(decided, f"{type(command).__name__} rejected: {decided}")
    decision = decided.events if isinstance(decided, Draft) else decided
    if state is None:
        assert isinstance(command, CreateRun)  # decide rejects everything else for a missing run
        run_id, first = command.run_id, 1
    else:
        run_id, first = state.run_id, state.sequence + 1
    if not decision:
        assert state is not None
        return Commit(state, (), ())
    records = seal_events(run_id, first, decision, ids)
    if keeps_run_index(journal):
        # The run's index entry is the run after the batch, stored in the same atomic step. It is
        # read off the draft the batch was decided on, so asking for it changes nothing: a journal
        # may ask before its checks (to send entry and records in one request), and a refused
        # append still leaves ``state`` as it was.
        assert isinstance(decided, Draft)  # a decision with events was made on a draft

        def entry() -> IndexEntry:
            return index_entry(decided)

        result = journal.append_indexed(run_id, first, records, fence, entry)
        _check_ack(journal.url, run_id, first, records, result)
    else:
        result = journal.append(run_id, first, records, fence)
        _check_ack(journal.url, run_id, first, records, result)
    if isinstance(decided, Draft):
        # The rules already ran on the draft: the state takes its results instead of reducing the
        # batch a second time (Draft.settle; a property test holds it equal to reducing).
        state = decided.settle()
    else:
        for offset, event in enumerate(decision):
            state = reduce(state, event, first + offset)
    assert state is not None
    return Commit(state, tuple(decision), tuple(records))


def keeps_run_index(journal: WorkflowJournal) -> TypeGuard[RunIndexJournal]:
    """Whether ``journal`` declares the run index (``run_index``; see :mod:`mayfly.runindex`).

    A declared flag is the promise; :data:`~mayfly.runindex.RUN_INDEX` checks,
    once per journal class, that the promise is kept.
    """
    if not journal.capabilities.run_index:
        return False
    kind = type(journal)
    if kind not in _INDEXED:
        RUN_INDEX.of(journal)  # raises CompatibilityError if the class does not implement it
        _INDEXED.add(kind)
    return True


_INDEXED: set[type] = set()


def _check_ack(url: str, run_id: str, first: int, records: list[JournalRecord], result: AppendResult) -> None:
    last = first + len(records) - 1
    if result.run_id != run_id or result.last_sequence != last or tuple(result.records) != tuple(records):
        raise CorruptionError(
            f"journal {url} acknowledged a different batch for run {run_id}: expected "
            f"sequences {first}..{last} as decided, got last sequence {result.last_sequence} "
            f"with {len(result.records)} record(s); refusing to expose unverified state"
        )
