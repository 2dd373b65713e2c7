"""``JournalBase``: the public journal methods written once, over a backend's small storage hooks.

The base owns what every backend used to repeat: argument validation
(:func:`~mayfly.journal.validate_batch` with its fast path for records sealed
in this process, :func:`~mayfly.journal.validate_read`, run ids, listing
limits, the snapshot guards), the closed-state check, the ``url`` /
``durability`` / ``capabilities`` properties, the context manager, and the
wording of every error the contract names. A backend implements the ``_``
hooks against its store, and calls the helpers below for the decisions the
contract fixes (fencing, exact replay versus conflict, read windows), so an
error reads the same whichever store raised it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import ClassVar, Final, Self, TypeVar

import msgspec

from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    RunTail,
    SnapshotRecord,
    validate_batch,
    validate_read,
    validate_tails,
)
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    CompatibilityError,
    ConflictingRecord,
    CorruptionError,
    FencingRejected,
    InvalidRecord,
    JournalGap,
    JournalUnavailable,
    SnapshotCorrupt,
)
from mayfly.model.ids import parse_run_id
from mayfly.runindex import IndexEntry

__all__ = ["MAX_LIST_LIMIT", "JournalBase", "decode_snapshot", "encode_snapshot"]

MAX_LIST_LIMIT: Final = 100_000
"""Largest ``limit`` accepted by ``list_runs`` (and ``run_summaries``)."""

_T = TypeVar("_T")


class JournalBase(abc.ABC):
    """A :class:`~mayfly.journal.WorkflowJournal` whose public methods are implemented once.

    Subclass it, call ``super().__init__(url=..., capabilities=...)`` with the
    redacted URL and what the store declares, and implement the storage hooks
    (``_append``, ``_read``, ``_next_sequence``, ``_list_runs``,
    ``_write_snapshot``, ``_read_snapshot``, ``_close``). Each hook receives
    arguments that are already validated: canonical run ids, a batch that
    passed :func:`~mayfly.journal.validate_batch`, a window that passed
    :func:`~mayfly.journal.validate_read`, a sealed snapshot of the right run.
    A closed journal refuses every call with ``JournalUnavailable`` before a
    hook runs. Set :attr:`remedy` to what an operator should do about damage;
    it ends every corruption message the helpers build.

    Optional features (``JournalFaults``, ``RunPurge``...) are methods of the
    subclass, declared in its capabilities; :meth:`open_run` gives them the
    same argument and closed-state checks. ``run_tails`` is written here once
    (:meth:`read_tails`): a backend that declares it gets a correct one over
    its snapshot and read hooks, and overrides ``_read_tails`` where its store
    can read many runs at once (one query).
    """

    remedy: ClassVar[str] = "restore the store from a backup"
    """What to do about damage, ending every corruption message (``restore the database from a backup``)."""

    def __init__(self, *, url: str, capabilities: JournalCapabilities) -> None:
        self._url = url
        self._capabilities = capabilities
        self._closed = False

    # -- what the backend declares ---------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL the journal was opened from, with any password replaced by ``***``."""
        return self._url

    @property
    def durability(self) -> Durability:
        """The durability level met before :meth:`append` returns."""
        return self._capabilities.durability

    @property
    def capabilities(self) -> JournalCapabilities:
        """What this backend supports (see :class:`~mayfly.journal.JournalCapabilities`)."""
        return self._capabilities

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- the journal contract ----------------------------------------------------------------

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Atomically append ``records`` at ``expected_next``; see ``WorkflowJournal.append``."""
        batch = validate_batch(run_id, expected_next, records, fence)
        if self._closed:
            raise self.closed_error(f"append to run {run_id}")
        return self._append(run_id, expected_next, batch, fence)

    def append_indexed(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None,
        index: Callable[[], IndexEntry],
    ) -> AppendResult:
        """Append like :meth:`append` and store the run's new index entry in the same atomic step.

        Only for a journal declaring ``run_index``; see
        :meth:`mayfly.runindex.RunIndexJournal.append_indexed` for when to call ``index``.
        """
        batch = validate_batch(run_id, expected_next, records, fence)
        if self._closed:
            raise self.closed_error(f"append to run {run_id}")
        if not self._capabilities.run_index:
            raise CompatibilityError(
                f"{type(self).__qualname__} ({self._url}) does not declare run_index; append without an index"
            )
        run = batch[0].run_id

        def entry() -> IndexEntry:
            value = index()
            if not isinstance(value, IndexEntry) or value.run_id != run:
                raise InvalidRecord(f"append to run {run}: the index entry must be an IndexEntry of that run")
            return value

        return self._append_indexed(run, expected_next, batch, fence, entry)

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Return the run's records after ``after`` in order, each verified; see the Protocol."""
        run, start, count = validate_read(run_id, after, limit)
        if self._closed:
            raise self.closed_error(f"read of run {run}")
        if count == 0:
            return []
        return self._read(run, start, count)

    def read_tails(self, run_ids: Sequence[str]) -> list[RunTail]:
        """Each run's usable snapshot and the records from it on, in order; see ``RunTails``.

        Only for a journal declaring ``run_tails`` (``CompatibilityError``
        otherwise). The base verifies each snapshot the hook returns, as
        :meth:`read_snapshot` does; an unusable one is discarded (named in
        ``discarded``) and the run's whole history read instead.
        """
        runs = validate_tails(run_ids)
        if self._closed:
            raise self.closed_error("reading run tails")
        if not self._capabilities.run_tails:
            raise CompatibilityError(
                f"{type(self).__qualname__} ({self._url}) does not declare run_tails; read runs one by one"
            )
        if not runs:
            return []
        found = self._read_tails(runs)
        if len(found) != len(runs):
            raise CorruptionError(f"{self._url} answered {len(found)} run tails for {len(runs)} runs")
        tails: list[RunTail] = []
        for run, (snapshot, records) in zip(runs, found, strict=True):
            problem: str | None = None
            if isinstance(snapshot, SnapshotCorrupt):
                problem = str(snapshot)
            elif snapshot is not None:
                try:
                    snapshot.verify()
                    if snapshot.run_id != run:
                        raise SnapshotCorrupt(run, f"the store holds the snapshot of run {snapshot.run_id}")
                except SnapshotCorrupt as error:
                    problem = str(error)
            if problem is not None:
                whole = tuple(self._read(run, 0, None))
                tails.append(RunTail(run_id=run, snapshot=None, records=whole, discarded=problem))
            else:
                usable = snapshot if isinstance(snapshot, SnapshotRecord) else None
                tails.append(RunTail(run_id=run, snapshot=usable, records=tuple(records)))
        return tails

    def next_sequence(self, run_id: str) -> int:
        """Return the sequence the next append must carry (1 for a new run)."""
        return self._next_sequence(self.open_run(run_id, "next sequence"))

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Return up to ``limit`` sorted run ids holding records, all greater than ``after``."""
        start = None if after is None else parse_run_id(after)
        self.check_limit("list_runs", limit)
        if self._closed:
            raise self.closed_error("listing runs")
        return self._list_runs(start, limit)

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Store ``snapshot`` as the run's snapshot, replacing any earlier one atomically.

        Refuses (``InvalidRecord``, nothing written) anything but a sealed
        :class:`~mayfly.journal.SnapshotRecord` of this run whose checksum matches.
        """
        run = parse_run_id(run_id)
        if not isinstance(snapshot, SnapshotRecord):
            raise InvalidRecord(f"snapshot must be a SnapshotRecord, got {type(snapshot).__name__}")
        snapshot.validate()
        if snapshot.run_id != run:
            raise InvalidRecord(f"snapshot of run {snapshot.run_id} cannot be stored for run {run}")
        if snapshot.checksum != snapshot.expected_checksum():
            raise InvalidRecord(f"snapshot of run {run} does not match its checksum; reseal it")
        if self._closed:
            raise self.closed_error(f"snapshot of run {run}")
        self._write_snapshot(run, snapshot)

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """Return the run's snapshot, ``None`` if absent; raise ``SnapshotCorrupt`` if it is unusable.

        The stored snapshot is verified here, and one that names another run
        is corrupt too.
        """
        run = self.open_run(run_id, "snapshot read")
        snapshot = self._read_snapshot(run)
        if snapshot is None:
            return None
        snapshot.verify()
        if snapshot.run_id != run:
            raise SnapshotCorrupt(run, f"the store holds the snapshot of run {snapshot.run_id} there")
        return snapshot

    def close(self) -> None:
        """Release the store's resources; later calls raise ``JournalUnavailable``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def __enter__(self) -> Self:
        """Return the journal itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the journal."""
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._url!r})"

    # -- storage hooks -----------------------------------------------------------------------

    @abc.abstractmethod
    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        """Compare-and-append ``batch`` atomically under the fence; the batch is already validated.

        Inside one transaction (or lock): :meth:`check_fence`, then either
        write the batch (when ``expected_next`` is the run's next sequence and
        no batch event id is taken, else :meth:`event_id_taken`) or answer
        with :meth:`refused`. Return only once the declared durability is met.
        """

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        """:meth:`_append`, storing ``entry()`` with the batch (where ``run_index`` is declared)."""
        raise CompatibilityError(f"{type(self).__qualname__} declares run_index but keeps no index")

    @abc.abstractmethod
    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        """Return the records after ``after`` (at most ``limit``, never 0), usually via :meth:`window`."""

    @abc.abstractmethod
    def _next_sequence(self, run_id: str) -> int:
        """Return the run's next sequence (1 for an unknown run)."""

    @abc.abstractmethod
    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        """Return up to ``limit`` sorted ids of runs holding records, greater than ``after``."""

    @abc.abstractmethod
    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Replace the run's snapshot atomically with the (checked) ``snapshot``."""

    @abc.abstractmethod
    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """Return the stored snapshot decoded, or ``None``; the base verifies it."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release the store's resources (called once)."""

    def _read_tails(
        self, run_ids: tuple[str, ...]
    ) -> list[tuple[SnapshotRecord | SnapshotCorrupt | None, list[JournalRecord]]]:
        """For each run (validated, distinct), its stored snapshot and its records from the snapshot's
        ``last_sequence`` on (all, without one), where ``run_tails`` is declared.

        Return the snapshot as stored, not yet verified (the base does), or
        the ``SnapshotCorrupt`` its bytes raised (the base then reads the
        whole history). Read the records through :meth:`window` against the
        run's head, as ``_read`` does. This default reads run by run over
        ``_read_snapshot`` and ``_read``; a store that can read many runs in
        one query (and one consistent view) overrides it.
        """
        found: list[tuple[SnapshotRecord | SnapshotCorrupt | None, list[JournalRecord]]] = []
        for run in run_ids:
            try:
                snapshot = self._read_snapshot(run)
            except SnapshotCorrupt as error:
                found.append((error, []))
                continue
            after = 0 if snapshot is None else max(0, snapshot.last_sequence - 1)
            found.append((snapshot, self._read(run, after, None)))
        return found

    # -- helpers for hooks and optional features ---------------------------------------------

    def open_run(self, run_id: object, operation: str) -> str:
        """Return ``run_id`` parsed, or raise its typed input error; refuse if the journal is closed."""
        run = parse_run_id(run_id)
        if self._closed:
            raise self.closed_error(f"{operation} of run {run}")
        return run

    def ensure_open(self, operation: str) -> None:
        """Raise ``JournalUnavailable`` naming ``operation`` if the journal is closed."""
        if self._closed:
            raise self.closed_error(operation)

    def closed_error(self, operation: str) -> JournalUnavailable:
        """The ``JournalUnavailable`` a closed journal raises for ``operation``."""
        return JournalUnavailable(f"{operation} refused: journal {self._url} is closed; open it again")

    @staticmethod
    def check_limit(what: str, limit: object) -> int:
        """Return ``limit`` if in ``[1, MAX_LIST_LIMIT]``; else raise ``InvalidRecord`` naming ``what``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRecord(f"{what} limit must be an int in [1, {MAX_LIST_LIMIT}], got {limit!r}")
        return limit

    @staticmethod
    def check_fence(run_id: str, fence: int | None, current: int) -> None:
        """Raise ``FencingRejected`` unless ``fence`` is the run's current token (``None`` only while 0)."""
        if (fence is None and current != 0) or (fence is not None and fence != current):
            raise FencingRejected(run_id, 0 if fence is None else fence, current)

    @staticmethod
    def acknowledged(run_id: str, batch: tuple[JournalRecord, ...]) -> AppendResult:
        """The result of a batch that was just written."""
        return AppendResult(run_id=run_id, last_sequence=batch[-1].sequence, records=batch)

    @staticmethod
    def event_id_taken(run_id: str, event_id: str, sequence: int) -> ConflictingRecord:
        """The error for a new record whose event id is already committed at ``sequence``."""
        return ConflictingRecord(
            f"append rejected: run {run_id} event id {event_id} is already committed at sequence {sequence}"
        )

    def refused(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        *,
        actual_next: int,
        stored_at: Callable[[int], JournalRecord | None],
        sequence_of: Callable[[str], int | None],
    ) -> AppendResult:
        """Answer an append whose ``expected_next`` is not the run's next sequence: replay or conflict.

        ``stored_at(sequence)`` returns the committed record there, read whole
        and verified (so a damaged copy raises instead of passing for the
        record it was); ``sequence_of(event_id)`` where an event id is
        committed. An exact re-append of committed records is acknowledged
        with ``already_committed=True``; a batch event id committed with other
        content or at another sequence is a ``ConflictingRecord`` (same
        identity, different fact); anything else is an ordinary lost race,
        ``AppendConflict`` naming where the journal is. Nothing is written.
        """
        if all(record.sequence < actual_next and stored_at(record.sequence) == record for record in batch):
            return AppendResult(
                run_id=run_id, last_sequence=batch[-1].sequence, records=batch, already_committed=True
            )
        for record in batch:
            used = sequence_of(record.event_id)
            if used is None:
                continue
            stored = stored_at(used)
            if stored is None:
                raise CorruptionError(
                    f"append rejected: run {run_id} event id {record.event_id} is indexed at sequence "
                    f"{used}, which holds no record; {self.remedy}"
                )
            if used != record.sequence or stored != record:
                raise ConflictingRecord(
                    f"append rejected: run {run_id} event id {record.event_id} is already committed "
                    f"at sequence {used} with other content"
                )
        raise AppendConflict(run_id, expected_next, actual_next)

    def verified(self, record: JournalRecord) -> JournalRecord:
        """Return a record read from the store once verified; any damage raises ``ChecksumMismatch``.

        A field that breaks the input rules (a type name, a non-UTF-8
        payload, a value of the wrong type) is damage of the same kind as a
        wrong checksum: the message names run and sequence either way.
        """
        try:
            record.verify()
        except ChecksumMismatch:
            raise
        except ValueError as error:  # InvalidRecord, InvalidIdentifier, LimitExceeded
            raise ChecksumMismatch(
                f"record of run {record.run_id} sequence {record.sequence} is damaged ({error}); "
                f"{self.remedy}"
            ) from None
        return record

    def window(
        self,
        run_id: str,
        after: int,
        limit: int | None,
        rows: Iterable[tuple[int, _T]],
        decode: Callable[[int, _T], JournalRecord],
        *,
        next_sequence: int | None = None,
    ) -> list[JournalRecord]:
        """Turn the stored rows of a read window into records, failing closed on any hole.

        ``rows`` are ``(sequence, stored value)`` pairs in sequence order,
        starting after ``after``; ``decode(sequence, value)`` returns the
        verified record. A missing sequence raises ``JournalGap`` where it is.
        When ``next_sequence`` (the run's head, read in the same snapshot) is
        given, a row at or beyond it is corruption, and a window that stops
        short of it is a gap too, so a record missing at the end of the run
        never reads as a shorter history.
        """
        records: list[JournalRecord] = []
        expected = after + 1
        for sequence, value in rows:
            if sequence != expected:
                if type(sequence) is not int:
                    raise CorruptionError(
                        f"run {run_id} holds a malformed sequence {sequence!r} where sequence {expected} "
                        f"belongs; {self.remedy}"
                    )
                if sequence < expected:
                    raise CorruptionError(
                        f"run {run_id} holds sequence {sequence} out of order where sequence {expected} "
                        f"belongs; {self.remedy}"
                    )
                raise JournalGap(
                    f"journal gap in run {run_id}: expected sequence {expected}, found {sequence}; "
                    f"{self.remedy}"
                )
            if next_sequence is not None and sequence >= next_sequence:
                raise CorruptionError(
                    f"run {run_id} holds sequence {sequence} beyond its head (next sequence "
                    f"{next_sequence}); {self.remedy}"
                )
            records.append(decode(sequence, value))
            expected += 1
        if next_sequence is not None:
            wanted_end = next_sequence if limit is None else min(next_sequence, after + 1 + limit)
            if expected < wanted_end:
                raise JournalGap(
                    f"journal gap in run {run_id}: expected sequence {expected}, found none (the run's "
                    f"head is at {next_sequence}); {self.remedy}"
                )
        return records


def encode_snapshot(snapshot: SnapshotRecord) -> bytes:
    """The snapshot as self-describing bytes (msgspec JSON), for stores that keep it in one value."""
    return msgspec.json.encode(snapshot)


def decode_snapshot(run_id: str, body: bytes | bytearray | memoryview) -> SnapshotRecord:
    """Decode :func:`encode_snapshot` bytes; unreadable bytes raise ``SnapshotCorrupt`` naming the run."""
    try:
        return msgspec.json.decode(body, type=SnapshotRecord)
    except (msgspec.DecodeError, RecursionError) as error:
        raise SnapshotCorrupt(run_id, f"unreadable: {error}") from None
