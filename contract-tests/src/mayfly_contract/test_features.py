"""Contract clauses of the optional features a backend declares: summaries, tails, verification, purging.

A feature is a ``JournalCapabilities`` flag and a Protocol (``mayfly.journal.Feature``).
Declaring the flag is the promise: the journal must implement the Protocol,
and its clauses below run. A feature declared absent skips them with that
reason; nothing ever probes a backend's attributes.
"""

from __future__ import annotations

import time
import uuid

import pytest

from mayfly.errors import CorruptionError, FencingRejected, InvalidIdentifier, InvalidRecord, LeaseHeld
from mayfly.journal import (
    MAX_TAILS,
    OPTIONAL_FEATURES,
    RUN_PURGE,
    RUN_SUMMARIES,
    RUN_TAILS,
    RUN_VERIFICATION,
    JournalFaults,
    RunTails,
    WorkflowJournal,
)
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import RunNotFound
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.recovery import RecoveredRun, inspect_run, inspect_runs
from mayfly.runtime import HandlerRegistry, WorkflowRuntime
from mayfly_contract.support import Records, ScriptedRun, sequences, snapshot_of


def _just_below(run_id: str) -> str:
    """The run id one below ``run_id``: listing after it starts exactly at ``run_id``."""
    return str(uuid.UUID(int=uuid.UUID(run_id).int - 1))


@pytest.mark.clause("journal.features.declared-implemented")
def test_every_declared_feature_is_implemented(mayfly_journal: WorkflowJournal) -> None:
    """Each optional feature the capabilities declare is served by its Protocol; the others are absent."""
    for feature in OPTIONAL_FEATURES:
        served = feature.of(mayfly_journal)  # CompatibilityError if declared but not implemented
        assert (served is not None) == feature.declared(mayfly_journal), feature


# -- run summaries -------------------------------------------------------------------------------


def _runtime(journal: WorkflowJournal, leases: RecoveryLeaseStore) -> WorkflowRuntime:
    registry = HandlerRegistry()
    registry.register(
        "contract-ok", 1, lambda request: Succeeded(output={"node": request.node_id}), cooperative=True
    )
    return WorkflowRuntime(journal, registry, leases=leases, owner="contract-summaries")


@pytest.mark.clause("journal.summaries.listed")
@pytest.mark.capability("run_summaries")
def test_summaries_list_runs_with_workflow_status_and_sequence(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, records: Records
) -> None:
    """Runs of a workflow are summarised with its id, their final status and last sequence, newest first."""
    summaries = RUN_SUMMARIES.of(mayfly_journal)
    assert summaries is not None
    workflow = f"contract.summaries.w{records.new_id()[-12:]}"
    spec = WorkflowSpec(workflow_id=workflow, version=1, nodes=(Node("a", handler="contract-ok@1"),))
    runtime = _runtime(mayfly_journal, mayfly_leases)
    results = [runtime.execute(spec, run_id=records.new_id()) for _ in range(3)]
    found = summaries.run_summaries(workflow_id=workflow)
    assert sorted(s.run_id for s in found) == sorted(r.run_id for r in results)
    assert {(s.workflow_id, s.status) for s in found} == {(workflow, "succeeded")}
    sequence_of = {r.run_id: r.sequence for r in results}
    assert all(s.last_sequence == sequence_of[s.run_id] for s in found)
    assert all(s.created_at <= s.updated_at for s in found)
    assert [s.updated_at for s in found] == sorted((s.updated_at for s in found), reverse=True)


@pytest.mark.clause("journal.summaries.filters-and-pages")
@pytest.mark.capability("run_summaries")
def test_summaries_filter_by_status_and_page_by_update_time(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, records: Records
) -> None:
    """A status filter keeps only that status, limit caps the page and updated_before pages older rows."""
    summaries = RUN_SUMMARIES.of(mayfly_journal)
    assert summaries is not None
    workflow = f"contract.pages.w{records.new_id()[-12:]}"
    spec = WorkflowSpec(workflow_id=workflow, version=1, nodes=(Node("a", handler="contract-ok@1"),))
    runtime = _runtime(mayfly_journal, mayfly_leases)
    for _ in range(3):
        runtime.execute(spec, run_id=records.new_id())
    first = summaries.run_summaries(workflow_id=workflow, status="succeeded", limit=2)
    assert len(first) == 2
    rest = summaries.run_summaries(workflow_id=workflow, updated_before=first[-1].updated_at)
    assert all(s.updated_at < first[-1].updated_at for s in rest)
    assert summaries.run_summaries(workflow_id=workflow, status="failed") == []


@pytest.mark.clause("journal.summaries.inputs")
@pytest.mark.capability("run_summaries")
def test_summaries_refuse_bad_arguments(mayfly_journal: WorkflowJournal) -> None:
    """A limit outside [1, 100000] or a filter that is not a string raises InvalidRecord."""
    summaries = RUN_SUMMARIES.of(mayfly_journal)
    assert summaries is not None
    for limit in (0, -1, 100_001, True, "5", 2.0):
        with pytest.raises(InvalidRecord):
            summaries.run_summaries(limit=limit)  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidRecord):
        summaries.run_summaries(status=5)  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidRecord):
        summaries.run_summaries(workflow_id=b"w")  # type: ignore[arg-type]  # bad input on purpose


# -- run tails -----------------------------------------------------------------------------------


def _tails(journal: WorkflowJournal) -> RunTails:
    tails = RUN_TAILS.of(journal)
    assert tails is not None, "run_tails is declared, so RUN_TAILS.of must serve the journal"
    return tails


@pytest.mark.clause("journal.tails.match-reads")
@pytest.mark.capability("run_tails")
def test_tails_hold_what_snapshot_and_record_reads_return(
    mayfly_journal: WorkflowJournal, records: Records
) -> None:
    """Each run's tail, in the order asked: its snapshot and the records from the snapshot's last sequence
    on (read_snapshot and read would return the same), or the whole history without one; an unknown run
    has neither."""
    tails = _tails(mayfly_journal)
    snapped, plain, unknown = records.new_id(), records.new_id(), records.new_id()
    for run in (snapped, plain):
        mayfly_journal.append(run, 1, records.batch(run, 1, 4))
    if mayfly_journal.capabilities.snapshots:
        mayfly_journal.write_snapshot(snapped, snapshot_of(mayfly_journal.read(snapped)[2]))
    found = tails.read_tails([unknown, snapped, plain])
    assert [tail.run_id for tail in found] == [unknown, snapped, plain]
    assert (found[0].snapshot, found[0].records, found[0].discarded) == (None, (), None)
    for tail in found[1:]:
        snapshot = mayfly_journal.read_snapshot(tail.run_id)
        assert tail.snapshot == snapshot and tail.discarded is None
        after = 0 if snapshot is None else snapshot.last_sequence - 1
        assert list(tail.records) == mayfly_journal.read(tail.run_id, after=after)
    if mayfly_journal.capabilities.snapshots:
        assert sequences(list(found[1].records)) == [3, 4]
    assert sequences(list(found[2].records)) == [1, 2, 3, 4]
    assert tails.read_tails([]) == []


@pytest.mark.clause("journal.tails.inspect-equal")
@pytest.mark.capability("run_tails")
def test_inspecting_runs_together_equals_inspecting_each(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, records: Records
) -> None:
    """inspect_runs over the tails rebuilds, for real runs at every index status (and finished ones,
    snapshotted or not), exactly what inspect_run rebuilds one by one; an unknown run is RunNotFound."""
    queue = f"contract-tails-{records.new_id()[-12:]}"
    epoch = time.time_ns() // 1_000_000
    runs = []
    for step in range(1, ScriptedRun.STEPS + 1):
        scripted = ScriptedRun(records.new_id(), queue=queue, epoch_ms=epoch)
        scripted.advance_to(step, mayfly_journal, indexed=False)
        runs.append(scripted.run_id)
    spec = WorkflowSpec(
        workflow_id=f"contract.tails.w{records.new_id()[-12:]}",
        version=1,
        nodes=(Node("a", handler="contract-ok@1"), Node("b", handler="contract-ok@1", depends_on=("a",))),
    )
    registry = HandlerRegistry()
    registry.register("contract-ok", 1, lambda request: Succeeded(output={"n": 1}), cooperative=True)
    runtime = WorkflowRuntime(
        mayfly_journal, registry, leases=mayfly_leases, owner="contract-tails", snapshot_every=2
    )
    runs += [runtime.execute(spec, run_id=records.new_id()).run_id for _ in range(2)]
    unknown = records.new_id()
    together = inspect_runs(mayfly_journal, [*runs, unknown])
    assert isinstance(together[-1], RunNotFound)
    for run, inspected in zip(runs, together, strict=False):
        alone = inspect_run(mayfly_journal, run)
        assert isinstance(inspected, RecoveredRun), inspected
        assert inspected.state.to_record() == alone.state.to_record()
        assert (inspected.source, inspected.records_reduced, inspected.last_record) == (
            alone.source,
            alone.records_reduced,
            alone.last_record,
        )


@pytest.mark.clause("journal.tails.corrupt-snapshot")
@pytest.mark.capability("run_tails")
@pytest.mark.capability("snapshots")
@pytest.mark.capability("fault_injection")
def test_a_corrupt_snapshot_is_discarded_and_the_whole_history_read(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A damaged snapshot is not handed out: the tail has none, says why, and holds the whole history."""
    tails = _tails(mayfly_journal)
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 3))
    mayfly_journal.write_snapshot(run_id, snapshot_of(mayfly_journal.read(run_id)[1]))
    mayfly_journal.corrupt_snapshot(run_id)
    (tail,) = tails.read_tails([run_id])
    assert tail.snapshot is None and tail.discarded
    assert sequences(list(tail.records)) == [1, 2, 3]


@pytest.mark.clause("journal.tails.fails-closed")
@pytest.mark.capability("run_tails")
@pytest.mark.capability("fault_injection")
def test_a_damaged_history_fails_the_tails_closed(mayfly_journal: WorkflowJournal, records: Records) -> None:
    """A damaged or missing record of any run named raises a CorruptionError; inspect_runs then reads the
    runs one by one, so only the damaged one is unreadable."""
    tails = _tails(mayfly_journal)
    assert isinstance(mayfly_journal, JournalFaults)
    sound, damaged, gapped = records.new_id(), records.new_id(), records.new_id()
    for run in (sound, damaged, gapped):
        mayfly_journal.append(run, 1, records.batch(run, 1, 4))
    mayfly_journal.corrupt_record(damaged, 2)
    mayfly_journal.remove_record(gapped, 4)
    for bad in (damaged, gapped):
        with pytest.raises(CorruptionError):
            tails.read_tails([sound, bad])
    assert [tail.run_id for tail in tails.read_tails([sound])] == [sound]


@pytest.mark.clause("journal.tails.inputs")
@pytest.mark.capability("run_tails")
def test_tails_refuse_bad_arguments(mayfly_journal: WorkflowJournal, records: Records) -> None:
    """A run_ids that is not a sequence of distinct canonical run ids, or names more than MAX_TAILS, is
    refused with InvalidRecord or InvalidIdentifier."""
    tails = _tails(mayfly_journal)
    run = records.new_id()
    for bad in ("abc", b"abc", 7, None, [run, run], [records.new_id() for _ in range(MAX_TAILS + 1)]):
        with pytest.raises(InvalidRecord):
            tails.read_tails(bad)  # type: ignore[arg-type]  # bad input on purpose
    for malformed in (["run-1"], [run.upper()], [7]):
        with pytest.raises(InvalidIdentifier):
            tails.read_tails(malformed)  # type: ignore[arg-type]  # bad input on purpose


# -- run verification ----------------------------------------------------------------------------


@pytest.mark.clause("journal.verification.counts")
@pytest.mark.capability("run_verification")
def test_verification_counts_a_sound_history(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """verify_run returns the number of committed records, and 0 for a run that holds none."""
    verifier = RUN_VERIFICATION.of(mayfly_journal)
    assert verifier is not None
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 3))
    mayfly_journal.append(run_id, 4, records.batch(run_id, 4, 2))
    assert verifier.verify_run(run_id) == 5
    assert verifier.verify_run(records.new_id()) == 0
    with pytest.raises(InvalidIdentifier):
        verifier.verify_run("not-a-run")


@pytest.mark.clause("journal.verification.fails-closed")
@pytest.mark.capability("run_verification")
@pytest.mark.capability("fault_injection")
def test_verification_finds_damage_and_gaps(mayfly_journal: WorkflowJournal, records: Records) -> None:
    """A damaged record or a missing one makes verify_run raise a CorruptionError."""
    verifier = RUN_VERIFICATION.of(mayfly_journal)
    assert verifier is not None and isinstance(mayfly_journal, JournalFaults)
    damaged, gapped = records.new_id(), records.new_id()
    for run in (damaged, gapped):
        mayfly_journal.append(run, 1, records.batch(run, 1, 4))
    mayfly_journal.corrupt_record(damaged, 2)
    mayfly_journal.remove_record(gapped, 2)
    for run in (damaged, gapped):
        with pytest.raises(CorruptionError):
            verifier.verify_run(run)


# -- run purging ---------------------------------------------------------------------------------


@pytest.mark.clause("journal.purge.removes-the-run")
@pytest.mark.capability("run_purge")
def test_purge_removes_history_snapshot_and_listing(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """A purged run reads empty from sequence 1, has no snapshot, is not listed; other runs are untouched."""
    purge = RUN_PURGE.of(mayfly_journal)
    assert purge is not None
    other = records.new_id()
    kept = records.batch(other, 1, 2)
    mayfly_journal.append(other, 1, kept)
    batch = records.batch(run_id, 1, 3)
    mayfly_journal.append(run_id, 1, batch)
    if mayfly_journal.capabilities.snapshots:
        mayfly_journal.write_snapshot(run_id, snapshot_of(batch[-1]))
    assert purge.purge_run(run_id) is True
    assert mayfly_journal.read(run_id) == []
    assert mayfly_journal.next_sequence(run_id) == 1
    assert mayfly_journal.read_snapshot(run_id) is None
    assert run_id not in mayfly_journal.list_runs(after=_just_below(run_id), limit=1)
    assert mayfly_journal.read(other) == kept
    assert purge.purge_run(run_id) is False
    again = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, again)  # the run id can hold a new history
    assert sequences(mayfly_journal.read(run_id)) == [1, 2]


@pytest.mark.clause("journal.purge.keeps-the-fence")
@pytest.mark.capability("run_purge")
@pytest.mark.capability("fencing")
def test_purge_keeps_fencing_tokens_monotonic(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """After a purge the run's fencing token stays: an unfenced append is refused, a new grant is higher."""
    purge = RUN_PURGE.of(mayfly_journal)
    assert purge is not None
    with mayfly_leases.acquire(run_id, "contract-purge", 30_000) as lease:
        mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 2), fence=lease.fencing_token)
    assert purge.purge_run(run_id) is True
    assert mayfly_leases.current_fence(run_id) == lease.fencing_token
    with pytest.raises(FencingRejected):
        mayfly_journal.append(run_id, 1, records.batch(run_id, 1))
    with mayfly_leases.acquire(run_id, "contract-purge", 30_000) as later:
        assert later.fencing_token > lease.fencing_token
        mayfly_journal.append(run_id, 1, records.batch(run_id, 1), fence=later.fencing_token)


@pytest.mark.clause("journal.purge.refuses-a-held-run")
@pytest.mark.capability("run_purge")
def test_purge_of_a_leased_run_is_refused(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """While the run's lease is held, purge_run raises LeaseHeld and the history stays whole."""
    purge = RUN_PURGE.of(mayfly_journal)
    assert purge is not None
    with mayfly_leases.acquire(run_id, "contract-holder", 30_000) as lease:
        batch = records.batch(run_id, 1, 2)
        fence = lease.fencing_token if mayfly_journal.capabilities.fencing else None
        mayfly_journal.append(run_id, 1, batch, fence=fence)
        with pytest.raises(LeaseHeld):
            purge.purge_run(run_id)
        assert mayfly_journal.read(run_id) == batch
    assert purge.purge_run(run_id) is True


@pytest.mark.clause("journal.purge.inputs")
@pytest.mark.capability("run_purge")
def test_purge_refuses_malformed_run_ids(mayfly_journal: WorkflowJournal) -> None:
    """A malformed run id is an InvalidIdentifier and purges nothing."""
    purge = RUN_PURGE.of(mayfly_journal)
    assert purge is not None
    for bad in ("run-1", "", "0193A5C4-7B1E-7C3D-9F00-1234567890AB", 7):
        with pytest.raises(InvalidIdentifier):
            purge.purge_run(bad)  # type: ignore[arg-type]  # bad input on purpose
