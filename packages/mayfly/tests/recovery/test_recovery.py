"""Snapshots and the three recovery modes against the real local journal."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from conftest import node, workflow

from mayfly.commit import commit_command
from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AdvanceTime, AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.errors import (
    CorruptionError,
    HandlerUnavailable,
    HistoryLost,
    LeaseHeld,
    ResumeRefused,
    RunNotFound,
)
from mayfly.model.events import RunCreated
from mayfly.model.ids import DeterministicIdSource, idempotency_key
from mayfly.model.json import content_hash
from mayfly.model.outcomes import ChangesRequested, RetryableFailure, Succeeded
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    FixedBackoff,
    Node,
    OnOutcome,
    RetryPolicy,
    WorkflowSpec,
)
from mayfly.model.state import RunState
from mayfly.recovery import (
    DispatchReady,
    ReconcileAttempt,
    RestoreRetryTimer,
    inspect_run,
    replay_run,
    required_handlers,
    resume_run,
)
from mayfly.reducer import encode_event
from mayfly.snapshot import make_snapshot

SPEC = workflow(
    node("a"),
    node("b", retry=RetryPolicy(backoff=FixedBackoff(delay_ms=500), attempt_deadline_ms=9_000)),
    node("c"),
    node("d"),
    node("e", "a"),
)


class Store:
    def __init__(self, root: Path) -> None:
        url = f"file://{root}/store?durability=write"
        self.journal = LocalWorkflowJournal(url)
        self.leases = LocalLeaseStore(url)
        self.ids = DeterministicIdSource(9)

    def commit(self, state: RunState | None, command: object) -> RunState:
        return commit_command(self.journal, state, command, ids=self.ids).state  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path)


def in_flight(store: Store) -> tuple[str, RunState, dict[str, str]]:
    """A run with a: succeeded, b: retry pending, c: running, d: ready, e: ready."""
    run_id = store.ids.new_id()
    state = store.commit(None, CreateRun(run_id=run_id, spec=SPEC))
    attempts = {n: store.ids.new_id() for n in "abc"}
    state = store.commit(state, StartNodes(tuple(AttemptStart(n, attempts[n]) for n in "abc")))
    state = store.commit(state, AdvanceTime(100))
    state = store.commit(state, CompleteAttempt("a", attempts["a"], Succeeded()))
    state = store.commit(state, CompleteAttempt("b", attempts["b"], RetryableFailure(reason="x")))
    return run_id, state, attempts


def test_inspect_without_snapshot_replays_the_journal(store: Store) -> None:
    """With no snapshot, inspection reduces the whole history and says so."""
    run_id, state, _ = in_flight(store)
    recovered = inspect_run(store.journal, run_id)
    assert recovered.source == "journal" and recovered.diagnostics == ()
    assert recovered.state.to_record() == state.to_record()


def test_inspect_uses_a_valid_snapshot_and_the_tail(store: Store) -> None:
    """A current snapshot is used, and only records after it are reduced."""
    run_id, state, attempts = in_flight(store)
    last = store.journal.read(run_id)[-1]
    store.journal.write_snapshot(run_id, make_snapshot(state, last))
    state = store.commit(state, CompleteAttempt("c", attempts["c"], Succeeded()))
    recovered = inspect_run(store.journal, run_id)
    assert recovered.source == "snapshot"
    assert recovered.records_reduced == 1
    assert recovered.state.to_record() == state.to_record()
    assert replay_run(store.journal, run_id).state.to_record() == state.to_record()


def test_a_corrupt_snapshot_is_discarded_with_a_diagnostic(store: Store) -> None:
    """Damaged snapshot bytes are never trusted: rebuild from events and report why."""
    run_id, state, _ = in_flight(store)
    store.journal.write_snapshot(run_id, make_snapshot(state, store.journal.read(run_id)[-1]))
    store.journal.corrupt_snapshot(run_id)
    recovered = inspect_run(store.journal, run_id)
    assert recovered.source == "journal"
    assert len(recovered.diagnostics) == 1 and "snapshot discarded" in recovered.diagnostics[0]
    assert recovered.state.to_record() == state.to_record()


def test_a_snapshot_with_an_unknown_schema_version_is_discarded(store: Store) -> None:
    """An unknown snapshot version is treated like a corrupt one (ARCHITECTURE section 11)."""
    run_id, state, _ = in_flight(store)
    good = make_snapshot(state, store.journal.read(run_id)[-1])
    fields = msgspec.structs.asdict(good)
    del fields["checksum"]
    store.journal.write_snapshot(run_id, SnapshotRecord.seal(**{**fields, "schema_version": 99}))
    recovered = inspect_run(store.journal, run_id)
    assert recovered.source == "journal"
    assert "unknown schema version 99" in recovered.diagnostics[0]


def test_a_stale_snapshot_that_names_another_record_is_discarded(store: Store) -> None:
    """A snapshot whose last record differs from the journal's (a forked history) is not used."""
    run_id, state, _ = in_flight(store)
    other_run, other_state, _ = in_flight(store)
    wrong = make_snapshot(other_state, store.journal.read(other_run)[-1])
    fields = msgspec.structs.asdict(wrong)
    del fields["checksum"]
    store.journal.write_snapshot(run_id, SnapshotRecord.seal(**{**fields, "run_id": run_id}))
    recovered = inspect_run(store.journal, run_id)
    assert recovered.source == "journal"
    assert "journal holds event" in recovered.diagnostics[0]
    assert recovered.state.to_record() == state.to_record()


def test_a_snapshot_ahead_of_the_journal_is_lost_history_not_a_stale_cache(store: Store) -> None:
    """A snapshot proving records the journal no longer holds fails every recovery mode closed; nothing is written."""
    run_id, state, _ = in_flight(store)
    store.journal.write_snapshot(run_id, make_snapshot(state, store.journal.read(run_id)[-1]))
    store.journal.remove_record(run_id, state.sequence)  # the journal loses its acknowledged tail
    held = store.journal.next_sequence(run_id) - 1
    assert held < state.sequence
    expected = f"run {run_id} lost committed records: its snapshot includes sequence {state.sequence}"
    for recover in (inspect_run, replay_run):
        with pytest.raises(HistoryLost, match=expected):
            recover(store.journal, run_id)
    with pytest.raises(HistoryLost, match=expected):
        resume_run(store.journal, store.leases, run_id, owner="test")
    assert store.journal.next_sequence(run_id) == held + 1
    assert store.journal.read_snapshot(run_id) is not None  # kept as evidence, never discarded
    store.leases.acquire(run_id, "next", 1_000).release()  # the refused resume let go of its lease


def test_a_missing_run_is_a_typed_error(store: Store) -> None:
    """Inspecting a run the journal does not hold raises RunNotFound."""
    with pytest.raises(RunNotFound, match="not found"):
        inspect_run(store.journal, store.ids.new_id())


def test_a_tampered_record_fails_closed(store: Store) -> None:
    """A corrupt journal record is never skipped: replay raises a corruption error."""
    run_id, _, _ = in_flight(store)
    store.journal.corrupt_record(run_id, 3)
    with pytest.raises(CorruptionError):
        replay_run(store.journal, run_id)


def test_resume_returns_ordered_effects_with_original_identities(store: Store) -> None:
    """Started attempts are reconciled under their ids and keys; timers restored; ready dispatched."""
    run_id, _, attempts = in_flight(store)
    with resume_run(store.journal, store.leases, run_id, owner="worker-1") as session:
        assert session.effects == (
            ReconcileAttempt(
                node_id="c",
                handler="c@1",
                attempt_id=attempts["c"],
                attempt=1,
                idempotency_key=idempotency_key(run_id, "c", attempts["c"]),
                deadline=None,
            ),
            RestoreRetryTimer(node_id="b", next_attempt=2, deadline=600),
            DispatchReady(node_ids=("d", "e")),
        )
        assert session.fence == session.lease.fencing_token >= 1


def test_completed_runs_produce_no_effects(store: Store) -> None:
    """Nothing is re-dispatched for a run that already has its terminal result."""
    run_id = store.ids.new_id()
    state = store.commit(None, CreateRun(run_id=run_id, spec=workflow(node("a"))))
    attempt = store.ids.new_id()
    state = store.commit(state, StartNodes((AttemptStart("a", attempt),)))
    store.commit(state, CompleteAttempt("a", attempt, Succeeded()))
    with resume_run(store.journal, store.leases, run_id, owner="w") as session:
        assert session.effects == ()


def test_unavailable_handlers_refuse_the_resume_write_nothing_and_release_the_lease(store: Store) -> None:
    """A missing handler of an unfinished node refuses the resume, naming it and its nodes (section 11)."""
    run_id, _, _ = in_flight(store)
    before = store.journal.read(run_id)
    # a's handler is gone too, but a already succeeded: a finished node needs no handler.
    gone = {"a@1", "c@1", "d@1"}
    with pytest.raises(ResumeRefused) as refused:
        resume_run(store.journal, store.leases, run_id, owner="w", handler_available=lambda h: h not in gone)
    assert isinstance(refused.value, HandlerUnavailable)
    assert refused.value.run_id == run_id
    assert refused.value.missing == (("c@1", ("c",)), ("d@1", ("d",)))
    assert str(refused.value) == (
        f"resume refused: run {run_id} needs handler(s) that are not registered or not compatible: "
        "c@1 -> node c, d@1 -> node d; nothing was written"
    )
    assert store.journal.read(run_id) == before
    with resume_run(store.journal, store.leases, run_id, owner="next", handler_available=lambda h: True) as s:
        assert [type(e) for e in s.effects] == [ReconcileAttempt, RestoreRetryTimer, DispatchReady]


def test_a_finished_node_that_a_correction_edge_can_restart_still_needs_its_handler(store: Store) -> None:
    """Only unfinished nodes need handlers, and a node a conditional edge may start again is unfinished."""
    loop = workflow(
        node("implement"),
        node("review", "implement"),
        node("ship", "review"),
        edges=(Edge("review", "implement", when=OnOutcome(ChangesRequested.kind)),),
        initial=("implement",),
    )
    run_id = store.ids.new_id()
    state = store.commit(None, CreateRun(run_id=run_id, spec=loop))
    for name in ("implement", "review"):
        attempt = store.ids.new_id()
        state = store.commit(state, StartNodes((AttemptStart(name, attempt),)))
        if name == "review":
            assert sorted(set(required_handlers(state))) == [
                ("implement@1", "implement"),
                ("review@1", "review"),
                ("ship@1", "ship"),
            ]
        state = store.commit(state, CompleteAttempt(name, attempt, Succeeded()))
    # review finished and nothing can start it again, so its edge can no longer restart implement.
    assert list(required_handlers(state)) == [("ship@1", "ship")]


def test_a_child_call_needs_every_handler_of_the_workflow_it_calls(store: Store) -> None:
    """An unfinished child-call node needs its called workflow's handlers, named by node path."""
    lint = ChildDefinition("acme.lint", 1, (Node("scan", handler="scan@1"), Node("fmt", handler="fmt@1")))
    gate = ChildDefinition("acme.gate", 1, (Node("inner", child=ChildCall("acme.lint", 1, "propagate")),))
    spec = workflow(
        node("checkout"),
        Node("gate", child=ChildCall("acme.gate", 1, "propagate"), depends_on=("checkout",)),
        catalog=(lint, gate),
    )
    run_id = store.ids.new_id()
    state = store.commit(None, CreateRun(run_id=run_id, spec=spec))
    assert list(required_handlers(state)) == [
        ("checkout@1", "checkout"),
        ("scan@1", "gate/inner/scan"),
        ("fmt@1", "gate/inner/fmt"),
    ]
    with pytest.raises(ResumeRefused) as refused:
        resume_run(store.journal, store.leases, run_id, owner="w", handler_available=lambda h: h != "fmt@1")
    assert refused.value.missing == (("fmt@1", ("gate/inner/fmt",)),)


def test_only_one_owner_may_resume_a_run(store: Store, tmp_path: Path) -> None:
    """A second resume while the lease is held raises LeaseHeld; after release it succeeds."""
    run_id, _, _ = in_flight(store)
    other = Store(tmp_path)
    with resume_run(store.journal, store.leases, run_id, owner="first") as first:
        with pytest.raises(LeaseHeld):
            resume_run(other.journal, other.leases, run_id, owner="second")
        token = first.fence
    with resume_run(other.journal, other.leases, run_id, owner="second") as second:
        assert second.fence > token


def test_resume_releases_the_lease_when_history_is_invalid(store: Store) -> None:
    """If reconstruction fails closed, the lease is not left held."""
    run_id, _, _ = in_flight(store)
    store.journal.remove_record(run_id, 2)
    with pytest.raises(CorruptionError):
        resume_run(store.journal, store.leases, run_id, owner="w")
    store.leases.acquire(run_id, "next", 1000).release()


def _created_by_an_earlier_mayfly(store: Store, spec: WorkflowSpec) -> str:
    """A run whose RunCreated pins ``spec`` under the hash content_hash() computed before it was canonical."""
    run_id = store.ids.new_id()
    event = RunCreated(run_id=run_id, spec=spec, spec_hash=content_hash(spec))
    encoded = encode_event(event)
    record = JournalRecord.seal(
        run_id=run_id,
        sequence=1,
        event_id=store.ids.new_id(),
        event_type=encoded.event_type,
        schema_version=encoded.schema_version,
        payload=encoded.payload,
    )
    store.journal.append(run_id, 1, [record])
    return run_id


@pytest.mark.parametrize(
    "spec",
    [
        # JSON that spells a default out: its decoded copy hashed as written, and still does.
        WorkflowSpec.from_json(
            b'{"workflow_id":"w","version":1,"budgets":{"max_attempts":10000},"nodes":[{"id":"a","handler":"a@1"}]}'
        ),
        # A default in an object of its own: written out live, left out after decoding.
        WorkflowSpec("w", 1, nodes=(Node("a", handler="a@1", policy=json.loads('"all_succeeded"')),)),
    ],
    ids=["spelled-out-in-json", "distinct-object"],
)
def test_runs_pinned_before_hashes_were_canonical_still_verify(store: Store, spec: WorkflowSpec) -> None:
    """A spec hash recorded by an earlier Mayfly verifies on replay, inspection and resume."""
    run_id = _created_by_an_earlier_mayfly(store, spec)
    assert replay_run(store.journal, run_id).state.spec_hash == content_hash(spec)
    inspect_run(store.journal, run_id)
    with resume_run(store.journal, store.leases, run_id, owner="t", ttl_ms=5_000) as session:
        assert session.state.spec == spec


def test_a_pinned_spec_that_matches_no_recorded_hash_fails_closed(store: Store) -> None:
    """A RunCreated whose spec is not the one its hash names is corruption, whichever hashing is tried."""
    run_id = store.ids.new_id()
    spec = WorkflowSpec("w", 1, nodes=(Node("a", handler="a@1"),))
    other = WorkflowSpec("w", 1, nodes=(Node("b", handler="a@1"),))
    encoded = encode_event(RunCreated(run_id=run_id, spec=spec, spec_hash=other.content_hash()))
    record = JournalRecord.seal(
        run_id=run_id,
        sequence=1,
        event_id=store.ids.new_id(),
        event_type=encoded.event_type,
        schema_version=encoded.schema_version,
        payload=encoded.payload,
    )
    store.journal.append(run_id, 1, [record])
    with pytest.raises(CorruptionError, match="does not match its recorded hash"):
        replay_run(store.journal, run_id)
