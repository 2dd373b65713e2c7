"""A worker serving stored schedules, in one process on the in-memory store: precedence, changes, problems."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowSpec
from mayfly.errors import CompatibilityError, SpecValidationError
from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import (
    Schedule,
    ScheduleConflict,
    add_schedule,
    get_schedule,
    remove_schedule,
    schedule_store,
    tick_run_id,
)
from mayfly.testing import MemoryStore, drop_store
from mayfly.worker import Worker

SPEC = WorkflowSpec(workflow_id="sched.mem", version=1, nodes=(Node("n", handler="n@1"),))


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()

    @handlers.handler("n")
    def n(request: HandlerRequest) -> Succeeded:
        return Succeeded(output={"input": request.run_input})

    return handlers


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    made = MemoryStore(f"sched-{uuid.uuid4().hex[:8]}")
    yield made
    drop_store(made.name)


def _serve(
    store: MemoryStore, *, until_runs: int, **options: Any
) -> tuple[WorkflowRuntime, list[dict[str, Any]]]:
    """Run a worker on the store until ``until_runs`` runs ended; return a runtime and its log."""
    log: list[dict[str, Any]] = []
    worker = Worker(
        store.journal(), registry(), leases=store.leases(), poll_interval_ms=50, log=log.append, **options
    )
    worker.run(until=lambda: worker.ended >= until_runs)
    return WorkflowRuntime(store.journal(), leases=store.leases()), log


def test_a_name_in_code_and_in_the_journal_is_served_from_the_code(store: MemoryStore) -> None:
    """Same name both ways: the code's definition starts the runs, and the clash is logged once."""
    journal = store.journal()
    add_schedule(journal, Schedule(name="dup", spec=SPEC, every_ms=1_000, input="stored"))
    code = Schedule(name="dup", spec=SPEC, every_ms=1_000, input="code")
    runtime, log = _serve(store, until_runs=2, schedules=[code])
    clashes = [e for e in log if e["event"] == "error" and "defined in the handlers code" in e["error"]]
    assert len(clashes) == 1 and "schedule remove dup" in clashes[0]["error"]
    runs = runtime.journal.list_runs()
    assert runs and all(runtime.inspect(run).state.input["input"] == "code" for run in runs)  # type: ignore[index, call-overload]


def test_a_worker_records_the_last_tick_and_serves_the_replacement(store: MemoryStore) -> None:
    """Ticks started are recorded; a replace (new input) is what the next ticks start with."""
    journal = store.journal()
    add_schedule(journal, Schedule(name="s", spec=SPEC, every_ms=1_000, input=1))
    runtime, _ = _serve(store, until_runs=1)
    stored = get_schedule(journal, "s")
    assert stored is not None and stored.last_tick_ms is not None
    assert runtime.journal.next_sequence(tick_run_id("s", stored.last_tick_ms)) > 1
    with pytest.raises(ScheduleConflict, match="exists already"):
        add_schedule(journal, Schedule(name="s", spec=SPEC, every_ms=1_000, input=2))
    replaced = add_schedule(journal, Schedule(name="s", spec=SPEC, every_ms=1_000, input=2), replace=True)
    assert (replaced.version, replaced.last_tick_ms) == (2, stored.last_tick_ms)
    runtime, _ = _serve(store, until_runs=1)
    after = get_schedule(journal, "s")
    assert after is not None and after.last_tick_ms is not None and after.last_tick_ms > stored.last_tick_ms
    assert runtime.inspect(tick_run_id("s", after.last_tick_ms)).state.input == {
        "scheduled_at_ms": after.last_tick_ms,
        "input": 2,
    }
    assert remove_schedule(journal, "s") and get_schedule(journal, "s") is None


def test_a_schedule_whose_runs_cannot_start_is_logged_once_and_the_worker_goes_on(store: MemoryStore) -> None:
    """A stored spec a plugin would refuse is not fatal: logged once, other schedules keep firing."""
    journal = store.journal()
    broken = WorkflowSpec(
        workflow_id="sched.broken", version=1, nodes=(Node("n", handler="n@1", depends_on=("x",)),)
    )
    with pytest.raises(SpecValidationError):
        add_schedule(journal, Schedule(name="broken", spec=broken, every_ms=1_000))
    schedule_store(journal).schedule_put(Schedule(name="broken", spec=broken, every_ms=1_000), now_ms=0)
    add_schedule(journal, Schedule(name="fine", spec=SPEC, every_ms=1_000))
    runtime, log = _serve(store, until_runs=2)
    problems = [e for e in log if e["event"] == "error" and "broken" in e["error"]]
    assert len(problems) == 1 and "cannot be started" in problems[0]["error"], problems
    assert len(runtime.journal.list_runs()) >= 2


def test_the_python_calls_name_the_feature_a_journal_lacks(store: MemoryStore) -> None:
    import msgspec

    journal = store.journal()
    journal._capabilities = msgspec.structs.replace(journal.capabilities, schedule_store=False)
    with pytest.raises(CompatibilityError, match="does not declare schedule_store"):
        add_schedule(journal, Schedule(name="x", spec=SPEC, every_ms=1_000))
