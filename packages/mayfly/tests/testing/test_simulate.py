"""mayfly.testing.simulate and the simulator core it is built on, on the memory and file journals."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mayfly import HandlerRegistry, Node, RetryableFailure, RetryPolicy, Succeeded, WorkflowSpec
from mayfly.errors import JournalUnavailable
from mayfly.testing import (
    EffectLog,
    FaultPlan,
    MemoryJournal,
    MemoryLeaseStore,
    MemoryStore,
    SimDriver,
    check_invariants,
    drop_store,
    expected_of,
    generate_workflow,
    sim_registry,
    simulate,
)

PAY = WorkflowSpec(
    "pay",
    1,
    (
        Node("charge", handler="charge@1", retry=RetryPolicy(max_attempts=2)),
        Node("ship", handler="ship@1", depends_on=("charge",)),
    ),
)


def charging(idempotent: bool, ledger: list[str], calls: list[str] | None = None) -> HandlerRegistry:
    """charge@1 appends to ``ledger``; the idempotent one returns the first charge of a key again."""
    registry = HandlerRegistry()

    @registry.handler("charge", version=1)
    def charge(req):  # type: ignore[no-untyped-def]
        if calls is not None:
            calls.append(req.idempotency_key)
        if idempotent and req.idempotency_key in ledger:
            return Succeeded(output={"charge": ledger.index(req.idempotency_key) + 1})
        ledger.append(req.idempotency_key)
        return Succeeded(output={"charge": len(ledger)})

    registry.register("ship", 1, lambda req: Succeeded(output={"shipped": True}))
    return registry


def test_a_handler_that_charges_again_on_reinvocation_is_reported_with_its_reproduce_call() -> None:
    ledger: list[str] = []
    report = simulate(PAY, charging(False, ledger), seeds=12)
    assert report.seeds == 12 and not report.ok
    kinds = {v.kind for failure in report.failures for v in failure.violations}
    assert kinds == {"non_idempotent"}
    first = report.failures[0]
    assert first.reproduce == f"simulate(spec, registry, seeds=[{first.seed}])"
    assert "charge returned different outcomes for one idempotency key mfk_" in first.violations[0].message
    assert str(report).endswith(f"12 seeds, {sum(len(f.violations) for f in report.failures)} violations")

    again = simulate(PAY, charging(False, []), seeds=[first.seed])  # the reproduce call, as printed
    assert [f.seed for f in again.failures] == [first.seed]
    assert again.failures[0].faults == first.faults
    assert [v.kind for v in again.failures[0].violations] == [v.kind for v in first.violations]


def test_an_idempotent_handler_passes_every_seed() -> None:
    ledger: list[str] = []
    calls: list[str] = []
    report = simulate(PAY, charging(True, ledger, calls), seeds=12)
    assert report.ok, str(report)
    assert str(report) == "12 seeds, 0 violations"
    # The faults did re-invoke charge under keys it had already charged.
    assert len(calls) > len(ledger) == len(set(calls))


def test_simulate_runs_on_a_file_journal_url(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/{{seed}}-{{slot}}?durability=write"
    report = simulate(PAY, charging(False, []), seeds=[1, 2, 3], backend=url)
    assert {v.kind for f in report.failures for v in f.violations} == {"non_idempotent"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{seed}-{slot}" for seed in (1, 2, 3) for slot in ("faulty", "reference")
    ]


def test_a_retry_that_depends_on_the_attempt_number_keeps_its_status_under_faults() -> None:
    registry = HandlerRegistry()

    @registry.handler("charge", version=1)
    def charge(req):  # type: ignore[no-untyped-def]
        return RetryableFailure(reason="busy") if req.attempt == 1 else Succeeded(output={"ok": True})

    registry.register("ship", 1, lambda req: Succeeded())
    report = simulate(PAY, registry, seeds=10, compare_outputs=True)
    assert report.ok, str(report)


def _driver(
    store: MemoryStore, effects: EffectLog, plan: FaultPlan | None = None, seed: int = 0
) -> SimDriver:
    return SimDriver(
        lambda: (MemoryJournal(store.url), MemoryLeaseStore(store.url)),
        sim_registry(effects),
        plan=plan,
        effects=effects,
        wall_jumps={1: -3_600_000, 2: 1_000},
        downtime_ms=86_400_000 if seed % 2 else 0,
    )


@pytest.mark.parametrize("seed", range(25))
def test_generated_workflows_keep_every_invariant_through_deaths(seed: int) -> None:
    rng = random.Random(seed)
    workflow = generate_workflow(rng)
    clean, faulty = MemoryStore(), MemoryStore()
    try:
        effects = EffectLog()
        reference = _driver(clean, effects)
        expected = expected_of(
            reference.run(workflow.spec, workflow.input, reference.ids.new_id(), workflow.events)
        )
        operations = reference.plan.operations
        deaths = sorted(rng.sample(range(operations), min(3, operations)))
        effects = EffectLog()
        effects.crash_after_effect = {0}
        plan = FaultPlan(crash_before=deaths[:1], crash_after=deaths[1:])
        driver = _driver(faulty, effects, plan, seed)
        run_id = driver.ids.new_id()
        driver.run(workflow.spec, workflow.input, run_id, workflow.events)
        assert driver.restarts >= 1 and plan.deaths >= 1
        assert driver.journal is not None
        violations = check_invariants(
            driver.journal.inner, {run_id: expected}, acknowledged=effects.acked, effects=effects
        )
        assert violations == []
        first = effects.invocations[0]  # died right after its effect: invoked again as the same attempt
        again = [inv for inv in effects.invocations if inv.attempt_id == first.attempt_id]
        assert len(again) >= 2 and {inv.idempotency_key for inv in again} == {first.idempotency_key}
    finally:
        drop_store(clean.name)
        drop_store(faulty.name)


def test_the_same_seed_generates_the_same_workflow() -> None:
    assert generate_workflow(random.Random(7)) == generate_workflow(random.Random(7))
    assert generate_workflow(random.Random(7)) != generate_workflow(random.Random(8))


def test_an_io_error_is_surfaced_typed_and_acknowledges_nothing() -> None:
    store = MemoryStore()
    try:
        effects = EffectLog()
        plan = FaultPlan(io_errors={0: "EIO at fsync"})
        driver = _driver(store, effects, plan)
        run_id = driver.ids.new_id()
        workflow = generate_workflow(random.Random(3), signals=False)
        driver.run(workflow.spec, workflow.input, run_id, workflow.events)
        assert [type(e) for e in driver.errors] == [JournalUnavailable]
        assert "simulated EIO at fsync during" in str(driver.errors[0])
        assert plan.io_failures == 1 and driver.restarts == 1
    finally:
        drop_store(store.name)


def test_the_checker_reports_lost_and_changed_acknowledged_records() -> None:
    store = MemoryStore()
    try:
        effects = EffectLog()
        driver = _driver(store, effects)
        workflow = generate_workflow(random.Random(5), signals=False)
        run_id = driver.ids.new_id()
        expected = expected_of(driver.run(workflow.spec, workflow.input, run_id, workflow.events))
        journal = driver.journal
        assert journal is not None
        stored = effects.acked[run_id]
        assert check_invariants(journal.inner, {run_id: expected}, acknowledged={run_id: stored}) == []
        lost = check_invariants(journal.inner, {}, acknowledged={run_id: len(stored) + 1})
        assert [v.kind for v in lost] == ["lost_ack"]
        changed = check_invariants(journal.inner, {}, acknowledged={run_id: [*stored[:-1], "0" * 64]})
        assert [v.kind for v in changed] == ["lost_ack"]
        other = expected_of(driver.runtime.summary(run_id)) if driver.runtime else expected
        wrong = type(other)(status="cancelled" if other.status != "cancelled" else "succeeded")
        assert [v.kind for v in check_invariants(journal.inner, {run_id: wrong}, acknowledged={})] == [
            "result_differs"
        ]
    finally:
        drop_store(store.name)


def test_a_wait_that_expires_late_or_a_signal_accepted_after_its_deadline_is_reported() -> None:
    from mayfly.model.events import SignalAccepted, SignalExpired, SignalWaitOpened, VirtualTimeAdvanced
    from mayfly.testing._sim import _check_deadlines

    attempt = "00000000-0000-7000-8000-000000000002"
    opened = SignalWaitOpened("n0", attempt, "go", "0" * 64, at=0, deadline=10)
    on_time = [opened, VirtualTimeAdvanced(10), SignalExpired("n0", attempt, "go", 10)]
    assert _check_deadlines("r", on_time) == []
    late = [opened, VirtualTimeAdvanced(12), SignalExpired("n0", attempt, "go", 10)]
    assert [v.kind for v in _check_deadlines("r", late)] == ["deadline_missed"]
    answered_late = [opened, SignalAccepted("s", "n0", attempt, "go", at=11)]
    assert "past its deadline 10" in _check_deadlines("r", answered_late)[0].message
