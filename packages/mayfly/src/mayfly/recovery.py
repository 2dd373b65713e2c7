"""Recovery modes: inspect, replay and resume a run from its journal (ADR-0032 "Restart recovery").

- :func:`inspect_run` rebuilds read-only state from a valid snapshot plus the
  journal tail, or from the whole journal when the snapshot is missing or
  unusable (with a diagnostic saying why).
- :func:`inspect_runs` does what :func:`inspect_run` does for many runs, in one
  read of the store where the journal offers ``run_tails`` (a run list page).
- :func:`replay_run` ignores snapshots and reduces the complete history.
- :func:`resume_run` first acquires the run's recovery lease, reconstructs the
  state, checks the pinned specification and that every unfinished node's
  handler is available, and returns the ordered effects that bring the run
  back to life. The lease guard lives in the returned :class:`ResumeSession`.
  A missing or incompatible handler refuses the resume (``ResumeRefused``):
  nothing is written and the lease is released, so the same resume with the
  right handlers registered continues the run (ARCHITECTURE section 11,
  "Missing handlers"). Blocked is an outcome a handler returns, never a
  penalty for resuming from the wrong process.

Completed nodes produce no effects. A started attempt without a terminal fact
produces :class:`ReconcileAttempt` with its original attempt id and
idempotency key: it is never silently marked successful or given a new id.
A started child-call attempt produces :class:`ReconcileChild`: the runtime
resumes the child run (or creates it, when the parent stopped between
``ChildStarted`` and the child's ``RunCreated``) and reports its terminal
result to the parent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Literal, Self, TypeAlias, final

import msgspec

from mayfly.journal import MAX_TAILS, RUN_TAILS, JournalRecord, RunTail, SnapshotRecord, WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard, RecoveryLeaseStore
from mayfly.model.errors import (
    CompatibilityError,
    CorruptionError,
    HistoryLost,
    JournalError,
    MayflyError,
    ResumeRefused,
    RunNotFound,
    SnapshotCorrupt,
)
from mayfly.model.ids import idempotency_key
from mayfly.model.json import content_hash
from mayfly.model.signals import AcceptedSignal
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.model.state import RunState, collector_paused
from mayfly.reducer import Upcaster, reduce_encoded
from mayfly.reducer.children import catalog_entry
from mayfly.runindex import RUN_INDEX, IndexEntry, index_entry
from mayfly.snapshot import restore_snapshot

__all__ = [
    "DispatchReady",
    "InspectedRun",
    "ReconcileAttempt",
    "ReconcileChild",
    "RecoveredRun",
    "RecoveryEffect",
    "RestoreRetryTimer",
    "RestoreSignalWait",
    "ResumeSession",
    "check_unfinished_handlers",
    "inspect_run",
    "inspect_runs",
    "load_run",
    "rebuild_run_index",
    "recovery_effects",
    "replay_records",
    "replay_run",
    "require_run",
    "required_handlers",
    "resume_claimed",
    "resume_run",
]


class ReconcileAttempt(msgspec.Struct, frozen=True, tag=True):
    """Re-invoke or reconcile a started attempt without a committed outcome, under its original ids."""

    node_id: str
    handler: str
    attempt_id: str
    attempt: int
    idempotency_key: str
    deadline: int | None
    signal: AcceptedSignal | None = None


class ReconcileChild(msgspec.Struct, frozen=True, tag=True):
    """Resume, or create if it does not exist yet, the child run a started child-call attempt awaits.

    Once the child run is terminal (possibly already before the restart),
    its result is reported to the parent attempt with ``CompleteChild``.
    """

    node_id: str
    attempt_id: str
    child_run_id: str


class RestoreSignalWait(msgspec.Struct, frozen=True, tag=True):
    """An attempt is parked on a durable wait: keep waiting for the signal or its deadline."""

    node_id: str
    attempt_id: str
    name: str
    deadline: int | None


class RestoreRetryTimer(msgspec.Struct, frozen=True, tag=True):
    """Register the recorded retry deadline again; the retry is released when time reaches it."""

    node_id: str
    next_attempt: int
    deadline: int


class DispatchReady(msgspec.Struct, frozen=True, tag=True):
    """Start attempts of nodes that were Ready but not yet started when the process stopped."""

    node_ids: tuple[str, ...]


RecoveryEffect: TypeAlias = (
    ReconcileAttempt | ReconcileChild | RestoreSignalWait | RestoreRetryTimer | DispatchReady
)
"""Everything :func:`resume_run` may ask the runtime to do, in the order given."""


@final
class RecoveredRun:
    """A reconstructed run: its state, how it was rebuilt, and any diagnostics on the way."""

    __slots__ = ("diagnostics", "last_record", "records_reduced", "source", "state")

    def __init__(
        self,
        state: RunState,
        source: Literal["snapshot", "journal"],
        records_reduced: int,
        last_record: JournalRecord,
        diagnostics: tuple[str, ...],
    ) -> None:
        self.state = state
        self.source = source
        self.records_reduced = records_reduced
        self.last_record = last_record
        self.diagnostics = diagnostics


def load_run(
    journal: WorkflowJournal,
    run_id: str,
    *,
    use_snapshot: bool = True,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> RecoveredRun:
    """Reconstruct a run's state from the journal, through its snapshot when one is usable."""
    diagnostics: list[str] = []
    state: RunState | None = None
    last: JournalRecord | None = None
    tail: list[JournalRecord] | None = None
    if use_snapshot:
        state, last, tail = _from_snapshot(journal, run_id, diagnostics)
    source: Literal["snapshot", "journal"] = "snapshot" if state is not None else "journal"
    after = 0 if state is None else state.sequence
    records = journal.read(run_id, after=after) if tail is None else tail
    if records:
        state = replay_records(records, state, run_id=run_id, url=journal.url, upcasters=upcasters)
        last = records[-1]
    if not use_snapshot:
        _check_not_behind_snapshot(journal, run_id, 0 if last is None else last.sequence)
    if state is None or last is None:
        raise RunNotFound(run_id)
    # restore_snapshot already checked a restored spec against its hash, and reducing never changes it.
    if source == "journal" and not _pinned_spec_verifies(state, records[0]):
        raise CorruptionError(
            f"run {run_id}: the pinned specification does not match its recorded hash {state.spec_hash}"
        )
    return RecoveredRun(state, source, len(records), last, tuple(diagnostics))


def replay_records(
    records: Sequence[JournalRecord],
    state: RunState | None,
    *,
    run_id: str,
    url: str,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> RunState:
    """Decode and reduce ``records``, which must follow ``state`` (``None``: from the first record).

    The collector is paused meanwhile (:func:`~mayfly.model.state.collector_paused`):
    a replay allocates per event but frees nothing cyclic, and with it running
    each event of a long history cost more than one of a short history.
    """

    def out_of_order(sequence: int, after: int) -> CorruptionError:
        return CorruptionError(f"journal {url} returned run {run_id} sequence {sequence} after {after}")

    with collector_paused():
        state = reduce_encoded(state, records, out_of_order=out_of_order, upcasters=upcasters)
    assert state is not None
    return state


def _pinned_spec_verifies(state: RunState, created: JournalRecord) -> bool:
    """Whether the run's pinned spec matches the hash its ``RunCreated`` (``created``) recorded.

    Before content hashes were canonical, a spec holding a default in an
    object of its own (``json.loads('"all_succeeded"')``) was hashed with that
    field written out, and its decoded copy no longer was; such a run still
    verifies against the spec exactly as its record holds it.
    """
    if state.spec.matches_hash(state.spec_hash):
        return True
    try:
        written = msgspec.json.decode(created.payload)["spec"]
        return bool(content_hash(written) == state.spec_hash)
    except (msgspec.DecodeError, KeyError, TypeError):
        return False


def _from_snapshot(
    journal: WorkflowJournal, run_id: str, diagnostics: list[str]
) -> tuple[RunState | None, JournalRecord | None, list[JournalRecord] | None]:
    """The restored state, the record at the snapshot and the tail after it, or three ``None`` if unusable.

    One read returns the snapshot's own record and the tail together.
    """
    try:
        snapshot = journal.read_snapshot(run_id)
    except SnapshotCorrupt as exc:
        diagnostics.append(f"snapshot discarded: {exc}")
        return None, None, None
    if snapshot is None:
        return None, None, None
    records = journal.read(run_id, after=snapshot.last_sequence - 1)
    return _restore(journal, run_id, snapshot, records, diagnostics)


def _restore(
    journal: WorkflowJournal,
    run_id: str,
    snapshot: SnapshotRecord,
    records: list[JournalRecord],
    diagnostics: list[str],
) -> tuple[RunState | None, JournalRecord | None, list[JournalRecord] | None]:
    """:func:`_from_snapshot` once read: ``records`` start at the snapshot's last sequence."""
    if not records:
        raise _lost(journal, run_id, snapshot.last_sequence)
    record = records[0] if records[0].sequence == snapshot.last_sequence else None
    restored = restore_snapshot(snapshot, record)
    if isinstance(restored, str):
        diagnostics.append(f"snapshot discarded: {restored}; rebuilt from the journal")
        return None, None, None
    return restored, record, records[1:]


InspectedRun: TypeAlias = RecoveredRun | MayflyError
"""What :func:`inspect_runs` gives for one run: the run, or the typed error reading it raised."""

_UNREADABLE = (JournalError, CorruptionError, CompatibilityError, RunNotFound)


def inspect_runs(
    journal: WorkflowJournal,
    run_ids: Sequence[str],
    *,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> list[InspectedRun]:
    """:func:`inspect_run` of each run, in order: the run, or the error its history raised.

    A journal that declares ``run_tails`` reads every run's snapshot and tail
    in one call (one query on PostgreSQL), at most ``MAX_TAILS`` runs a call;
    other journals, and a batch a damaged history fails, are read run by run,
    so one unreadable run never hides the others. A run without records is
    :class:`RunNotFound`.
    """
    tails = RUN_TAILS.of(journal)
    if tails is None:
        return [_inspected(journal, run_id, upcasters) for run_id in run_ids]
    found: list[InspectedRun] = []
    for start in range(0, len(run_ids), MAX_TAILS):
        chunk = run_ids[start : start + MAX_TAILS]
        try:
            read = tails.read_tails(chunk)
        except _UNREADABLE:
            found.extend(_inspected(journal, run_id, upcasters) for run_id in chunk)
            continue
        for tail in read:
            try:
                found.append(_from_tail(journal, tail, upcasters))
            except _UNREADABLE as error:
                found.append(error)
    return found


def _inspected(
    journal: WorkflowJournal, run_id: str, upcasters: Mapping[tuple[str, int], Upcaster] | None
) -> InspectedRun:
    try:
        return inspect_run(journal, run_id, upcasters=upcasters)
    except _UNREADABLE as error:
        return error


def _from_tail(
    journal: WorkflowJournal, tail: RunTail, upcasters: Mapping[tuple[str, int], Upcaster] | None
) -> RecoveredRun:
    """What :func:`load_run` with its snapshot rebuilds, from a tail already read."""
    run_id = tail.run_id
    diagnostics = [] if tail.discarded is None else [f"snapshot discarded: {tail.discarded}"]
    state: RunState | None = None
    last: JournalRecord | None = None
    records = list(tail.records)
    if tail.snapshot is not None:
        state, last, rest = _restore(journal, run_id, tail.snapshot, records, diagnostics)
        # A stale snapshot leaves only its tail here: the whole history is one more read.
        records = journal.read(run_id) if rest is None else rest
    source: Literal["snapshot", "journal"] = "snapshot" if state is not None else "journal"
    if records:
        state = replay_records(records, state, run_id=run_id, url=journal.url, upcasters=upcasters)
        last = records[-1]
    if state is None or last is None:
        raise RunNotFound(run_id)
    if source == "journal" and not _pinned_spec_verifies(state, records[0]):
        raise CorruptionError(
            f"run {run_id}: the pinned specification does not match its recorded hash {state.spec_hash}"
        )
    return RecoveredRun(state, source, len(records), last, tuple(diagnostics))


def _check_not_behind_snapshot(journal: WorkflowJournal, run_id: str, last_sequence: int) -> None:
    """Fail closed if the run's snapshot proves the history went further than ``last_sequence``.

    Replay ignores the snapshot's *state*, but not its evidence: an intact
    snapshot is sealed over its last sequence, so one that is ahead of the
    readable journal proves acknowledged records are gone (ADR-0032: journal
    gaps fail closed). An unreadable snapshot proves nothing and is ignored.
    """
    try:
        snapshot = journal.read_snapshot(run_id)
    except SnapshotCorrupt:
        return
    if snapshot is not None and snapshot.last_sequence > last_sequence:
        raise _lost(journal, run_id, snapshot.last_sequence)


def _lost(journal: WorkflowJournal, run_id: str, snapshot_sequence: int) -> HistoryLost:
    readable = journal.next_sequence(run_id) - 1
    return HistoryLost(
        run_id,
        f"its snapshot includes sequence {snapshot_sequence}, but the journal {journal.url} "
        f"holds only {readable} record(s)",
        remedy="restore the journal from a backup (the snapshot is kept as evidence, not discarded as stale)",
    )


def require_run(journal: WorkflowJournal, run_id: str) -> None:
    """Raise :class:`RunNotFound` unless the journal holds records of ``run_id``.

    Called before a run's lease is taken, so that a command naming a run that
    does not exist changes nothing (a lease grant creates lease and fencing
    state in some stores). Runs are never deleted, so the check cannot go stale.
    """
    if journal.next_sequence(run_id) == 1:
        raise RunNotFound(run_id)


_REBUILD_PAGE = 500


def rebuild_run_index(
    journal: WorkflowJournal,
    *,
    runs: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> int:
    """Recompute every run's index entry from its history and store it; return how many runs were indexed.

    The run index is derived data (:mod:`mayfly.runindex`): this is how a
    store written before it existed gets one, and how a damaged or stale
    index is repaired. Each run's state is rebuilt as :func:`inspect_run` does
    (through a valid snapshot), and its entry stored with ``index_put``, which
    never replaces an entry of a later sequence and keeps a stored wake. A run
    whose only work is in parked children is indexed as runnable: the worker
    that claims it finds that and parks it again. Rebuilding while workers run
    is safe.

    ``runs`` limits the rebuild to those runs (default: every run the journal
    lists). ``progress`` is called with the number of runs indexed so far after
    each page. A run whose history cannot be read does not stop the others; once
    every readable run is indexed, :class:`CorruptionError` names the ones that
    failed. A journal without the ``run_index`` feature raises
    :class:`CompatibilityError`.
    """
    index = RUN_INDEX.of(journal)
    if index is None:
        raise CompatibilityError(f"journal {journal.url} keeps no run index (it does not declare run_index)")
    indexed = 0
    failures: list[str] = []
    after: str | None = None
    chosen = None if runs is None else iter(list(runs))
    while True:
        if chosen is None:
            page = journal.list_runs(after=after, limit=_REBUILD_PAGE)
        else:
            page = [run_id for _, run_id in zip(range(_REBUILD_PAGE), chosen, strict=False)]
        if not page:
            break
        entries: list[IndexEntry] = []
        for run_id in page:
            try:
                entries.append(index_entry(load_run(journal, run_id, upcasters=upcasters).state))
            except (CorruptionError, CompatibilityError, RunNotFound) as exc:
                failures.append(f"{run_id} ({exc})")
        if entries:
            index.index_put(entries)
        indexed += len(entries)
        after = page[-1]
        if progress is not None:
            progress(indexed)
    if failures:
        shown = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
        raise CorruptionError(
            f"run index of {journal.url}: {indexed} run(s) indexed, {len(failures)} could not be read: "
            f"{shown}; check each with `mayfly replay RUN`"
        )
    return indexed


def inspect_run(
    journal: WorkflowJournal, run_id: str, *, upcasters: Mapping[tuple[str, int], Upcaster] | None = None
) -> RecoveredRun:
    """Read-only reconstruction from a valid snapshot and the journal tail.

    A journal that declares ``run_tails`` reads both at once (one query on
    PostgreSQL, where a snapshot read and a records read are two round trips).
    """
    tails = RUN_TAILS.of(journal)
    if tails is not None:
        (tail,) = tails.read_tails((run_id,))
        return _from_tail(journal, tail, upcasters)
    return load_run(journal, run_id, use_snapshot=True, upcasters=upcasters)


def replay_run(
    journal: WorkflowJournal, run_id: str, *, upcasters: Mapping[tuple[str, int], Upcaster] | None = None
) -> RecoveredRun:
    """Reduce the complete authoritative history, ignoring snapshots."""
    return load_run(journal, run_id, use_snapshot=False, upcasters=upcasters)


def required_handlers(state: RunState) -> Iterator[tuple[str, str]]:
    """``(handler contract, node path)`` for every handler the run's unfinished work may still invoke.

    A node needs its handler while it is unfinished, or finished but still
    reachable by a conditional edge that may fire (a correction loop starts it
    again). A finished node needs nothing, and a terminal run needs nothing.
    A child-call node needs every handler of the workflow it calls, under the
    path ``node/child-node`` (one more ``/`` per level): it may still start a
    fresh child run, which has no finished node. Contracts come in
    specification order, each node's path once per contract.
    """
    if state.status.is_terminal:
        return
    for node in state.nodes:
        if node.status.is_terminal and node.closed_in >= node.in_edges:
            continue
        yield from _node_handlers(state.spec, node.spec, node.node_id, frozenset())


def _node_handlers(
    spec: WorkflowSpec, node: Node, path: str, calling: frozenset[tuple[str, int]]
) -> Iterator[tuple[str, str]]:
    if node.handler is not None:
        yield node.handler, path
    call = node.child
    if call is None:
        return
    key = (call.workflow_id, call.version)
    definition = catalog_entry(spec, *key)
    # Validation refuses unknown and recursive calls; guard anyway, so a walk always ends.
    if definition is None or key in calling:
        return
    for child in definition.nodes:
        yield from _node_handlers(spec, child, f"{path}/{child.id}", calling | {key})


def check_unfinished_handlers(state: RunState, handler_available: Callable[[str], bool]) -> None:
    """Raise :class:`ResumeRefused` naming each unavailable contract the run still needs, and its nodes.

    See :func:`required_handlers` for what a run needs; ``handler_available``
    says whether a registered implementation serves a ``name@version``
    contract (declaring compatibility with it counts).
    """
    available: dict[str, bool] = {}
    missing: dict[str, list[str]] = {}
    for handler, path in required_handlers(state):
        ok = available.get(handler)
        if ok is None:
            ok = available[handler] = handler_available(handler)
        if not ok:
            missing.setdefault(handler, []).append(path)
    if missing:
        raise ResumeRefused(state.run_id, list(missing.items()))


def recovery_effects(state: RunState) -> tuple[RecoveryEffect, ...]:
    """The ordered effects that restore a run's in-flight work; none for a terminal run.

    Order: reconcile started attempts and child runs or restore their waits
    (in start order), restore retry timers (by deadline), then dispatch the
    ready nodes (in spec order). Whether the handlers are there is checked
    before, by :func:`check_unfinished_handlers`.
    """
    if state.status.is_terminal:
        return ()
    effects: list[RecoveryEffect] = []
    for attempt_id, index in state.active_attempts():
        node = state.node(index)
        if node.wait is not None:
            effects.append(RestoreSignalWait(node.node_id, attempt_id, node.wait.name, node.wait.deadline))
            continue
        if node.spec.child is not None:
            assert node.child_run_id is not None  # set by ChildStarted until the outcome closes it
            effects.append(ReconcileChild(node.node_id, attempt_id, node.child_run_id))
            continue
        effects.append(
            ReconcileAttempt(
                node_id=node.node_id,
                handler=node.spec.handler or "",
                attempt_id=attempt_id,
                attempt=node.attempt,
                idempotency_key=idempotency_key(state.run_id, node.node_id, attempt_id),
                deadline=node.attempt_deadline,
                signal=node.signal,
            )
        )
    for index, deadline in sorted(state.pending_retries(), key=lambda item: (item[1], item[0])):
        node = state.node(index)
        effects.append(RestoreRetryTimer(node.node_id, node.attempt + 1, deadline))
    ready = state.ready_nodes()
    if ready:
        effects.append(DispatchReady(tuple(ready)))
    return tuple(effects)


@final
class ResumeSession:
    """A resumed run owned by this process: state, effects to perform, and the held lease.

    Use it as a context manager (or call :meth:`close`) so the lease is
    released; append with :attr:`fence` so a newer owner can fence this one out.
    """

    __slots__ = ("diagnostics", "effects", "journal", "lease", "recovered", "state")

    def __init__(
        self,
        journal: WorkflowJournal,
        lease: RecoveryLeaseGuard,
        recovered: RecoveredRun,
        effects: tuple[RecoveryEffect, ...],
    ) -> None:
        self.journal = journal
        self.lease = lease
        self.recovered = recovered
        self.state = recovered.state
        self.effects = effects
        self.diagnostics = recovered.diagnostics

    @property
    def fence(self) -> int:
        """The fencing token every append of this session must carry."""
        return self.lease.fencing_token

    def close(self) -> None:
        """Release the recovery lease."""
        self.lease.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def resume_run(
    journal: WorkflowJournal,
    leases: RecoveryLeaseStore,
    run_id: str,
    *,
    owner: str,
    ttl_ms: int = 30_000,
    handler_available: Callable[[str], bool] | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> ResumeSession:
    """Take ownership of a run and return its state and ordered recovery effects.

    Acquisition is non-blocking: another live owner raises ``LeaseHeld``.
    Invalid history or a tampered specification fails closed (and the lease
    is released); an invalid snapshot is discarded with a diagnostic. With
    ``handler_available``, a handler the run's unfinished work needs and
    nothing serves raises :class:`~mayfly.model.errors.ResumeRefused`,
    before anything is written, and releases the lease.
    """
    require_run(journal, run_id)
    lease = leases.acquire(run_id, owner, ttl_ms)
    return resume_claimed(journal, lease, handler_available=handler_available, upcasters=upcasters)


def resume_claimed(
    journal: WorkflowJournal,
    lease: RecoveryLeaseGuard,
    *,
    handler_available: Callable[[str], bool] | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> ResumeSession:
    """Like :func:`resume_run`, for a run whose lease is already held (a worker's claim).

    The lease is released if the run cannot be resumed (invalid history, a
    refused handler check), exactly as :func:`resume_run` does.
    """
    run_id = lease.run_id
    try:
        recovered = inspect_run(journal, run_id, upcasters=upcasters)
        if handler_available is not None:
            check_unfinished_handlers(recovered.state, handler_available)
        effects = recovery_effects(recovered.state)
    except BaseException:
        lease.release()
        raise
    return ResumeSession(journal, lease, recovered, effects)
