"""Child workflows through WorkflowRuntime on the real local journal (issue 3, ADR-0032 "Children")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import mayfly
from mayfly import (
    Blocked,
    ChildCall,
    ChildDefinition,
    HandlerRegistry,
    HandlerRequest,
    Node,
    PermanentFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.commit import commit_command
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CancelRun, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.errors import CorruptionError, HandlerUnavailable
from mayfly.model.events import CancellationRequested, ChildStarted, RunCreated
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import NodeStatus, RunState
from mayfly.recovery import ReconcileChild, check_unfinished_handlers, inspect_run, recovery_effects
from mayfly.reducer import decode_event
from mayfly.reducer.children import child_create_run
from mayfly.runtime import UnsupportedInCurrentTask, WaitForSignal, cancel_run_cascade, new_signal_token
from mayfly.substrate import Hub, VirtualClock, sleep, spawn

LINT = ChildDefinition(
    workflow_id="acme.lint",
    version=1,
    nodes=(Node("scan", handler="scan@1", outputs=("warnings", "log")),),
    inputs=("repo",),
    outputs=("warnings",),
)

GATE = ChildDefinition(
    workflow_id="acme.gate",
    version=1,
    nodes=(
        Node(
            "inner",
            child=ChildCall("acme.lint", 1, "require_success", ("repo",), ("warnings",)),
            outputs=("warnings",),
        ),
    ),
    inputs=("repo",),
    outputs=("warnings",),
)


def lint_call(mode: str = "require_success") -> ChildCall:
    return ChildCall("acme.lint", 1, mode, inputs=("repo",), outputs=("warnings",))  # type: ignore[arg-type]


def ci(mode: str = "require_success", **lint_kw: Any) -> WorkflowSpec:
    """checkout -> lint (a call of acme.lint@1) -> report."""
    return WorkflowSpec(
        "acme.ci",
        1,
        (
            Node("checkout", handler="checkout@1"),
            Node(
                "lint",
                child=lint_call(mode),
                depends_on=("checkout",),
                **({"retry": RetryPolicy(max_attempts=1)} | lint_kw),
            ),
            Node("report", handler="report@1", depends_on=("lint",)),
        ),
        catalog=(LINT,),
    )


def lint_only(catalog: tuple[ChildDefinition, ...] = (LINT,)) -> WorkflowSpec:
    """A parent whose only node calls acme.lint@1 (for runs built by hand)."""
    return WorkflowSpec("acme.ci", 1, (Node("lint", child=lint_call()),), catalog=catalog)


class Env:
    def __init__(self, root: Path) -> None:
        self.url = f"file://{root}/journal?durability=write"
        self.journal = LocalWorkflowJournal(self.url)
        self.leases = LocalLeaseStore(self.url)
        self.registry = HandlerRegistry()
        self.seen: list[HandlerRequest] = []
        self.registry.register("checkout", 1, lambda req: Succeeded())
        self.registry.register("report", 1, lambda req: Succeeded(output=req.output_of("lint")))

    def scan(self, result: Any, *, cooperative: bool = False) -> None:
        """Register scan@1, recording each request and returning ``result`` (or ``result(req)``)."""

        def scan(req: HandlerRequest) -> Any:
            self.seen.append(req)
            return result(req) if callable(result) else result

        self.registry.register("scan", 1, scan, cooperative=cooperative)

    def runtime(self, **kwargs: Any) -> WorkflowRuntime:
        return WorkflowRuntime(self.journal, self.registry, leases=self.leases, **kwargs)

    def events(self, run_id: str) -> list[Any]:
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in self.journal.read(run_id)]

    def state(self, run_id: str) -> RunState:
        return inspect_run(self.journal, run_id).state


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


SCAN_OK = Succeeded(output={"warnings": 2, "log": "2 warnings in 14 files"})


# -- running child calls ------------------------------------------------------------


def test_a_child_call_runs_the_catalog_workflow_as_its_own_run_and_maps_declared_fields(env: Env) -> None:
    """The child run gets only the declared input fields and the parent node only the declared outputs."""
    env.scan(SCAN_OK)
    result = env.runtime().execute(ci(), {"repo": "acme/app", "token": "t0p"})
    assert result.status is RunStatus.SUCCEEDED
    assert result.outputs["lint"] == {"warnings": 2}  # "log" is not a declared output of the call
    assert result.outputs["report"] == {"warnings": 2}
    lint = result.nodes["lint"]
    assert (lint.status, lint.attempts) == (NodeStatus.SUCCEEDED, 1)
    child_id = lint.child_run_id
    assert child_id is not None and child_id != result.run_id
    assert result.nodes["checkout"].child_run_id is None
    (request,) = env.seen
    assert request.run_id == child_id
    assert request.run_input == {"repo": "acme/app"}  # the token is not copied into the child
    child = env.state(child_id)
    assert child.status is RunStatus.SUCCEEDED
    assert child.parent is not None
    assert (child.parent.run_id, child.parent.node_id, child.parent.depth) == (result.run_id, "lint", 1)
    assert child.spec.workflow_id == "acme.lint"


@pytest.mark.parametrize(
    ("scan_result", "child_result"),
    [(PermanentFailure(reason="linter crashed"), "failed"), (Blocked(reason="no license"), "blocked")],
)
def test_require_success_fails_the_parent_node_naming_the_childs_outcome(
    env: Env, scan_result: Any, child_result: str
) -> None:
    """Under require_success a failed or blocked child makes the parent node a PermanentFailure."""
    env.scan(scan_result)
    result = env.runtime().execute(ci("require_success"), {"repo": "acme/app"})
    lint = result.nodes["lint"]
    assert (lint.status, lint.outcome) == (NodeStatus.FAILED, NodeOutcomeKind.PERMANENT_FAILURE)
    assert (
        lint.reason
        == f"child run {lint.child_run_id} (acme.lint@1) {child_result}; the call requires success"
    )
    assert result.nodes["report"].status is NodeStatus.SKIPPED
    assert result.status is RunStatus.FAILED
    assert env.state(str(lint.child_run_id)).status.value == child_result


@pytest.mark.parametrize(
    ("scan_result", "kind", "run_status"),
    [
        (PermanentFailure(reason="linter crashed"), NodeOutcomeKind.PERMANENT_FAILURE, RunStatus.FAILED),
        (Blocked(reason="no license"), NodeOutcomeKind.BLOCKED, RunStatus.BLOCKED),
    ],
)
def test_propagate_gives_the_parent_node_the_childs_outcome_class(
    env: Env, scan_result: Any, kind: NodeOutcomeKind, run_status: RunStatus
) -> None:
    """Under propagate the parent node takes the child's outcome class, never success."""
    env.scan(scan_result)
    result = env.runtime().execute(ci("propagate"), {"repo": "acme/app"})
    lint = result.nodes["lint"]
    assert lint.outcome is kind
    assert str(lint.child_run_id) in lint.reason
    assert result.status is run_status


def test_two_levels_of_nesting_map_outputs_up_through_each_call(env: Env) -> None:
    """A root calls a child that calls a grandchild; each level is its own run with depth 1 and 2."""
    root = WorkflowSpec(
        "acme.ci",
        1,
        (Node("gate", child=ChildCall("acme.gate", 1, "propagate", ("repo",), ("warnings",))),),
        catalog=(LINT, GATE),
    )
    env.scan(SCAN_OK)
    result = env.runtime().execute(root, {"repo": "acme/app"})
    assert result.succeeded
    assert result.outputs == {"gate": {"warnings": 2}}
    child = env.state(str(result.nodes["gate"].child_run_id))
    assert child.status is RunStatus.SUCCEEDED and child.depth == 1
    grandchild_id = inspect_child_id(child, "inner")
    grandchild = env.state(grandchild_id)
    assert grandchild.depth == 2 and grandchild.parent is not None
    assert grandchild.parent.run_id == child.run_id
    assert env.seen[0].run_id == grandchild_id


def inspect_child_id(state: RunState, node_id: str) -> str:
    """The child run id of ``node_id``'s latest attempt in ``state``."""
    summary = mayfly.RunResult.of(state).nodes[node_id]
    assert summary.child_run_id is not None
    return summary.child_run_id


def test_handlers_of_the_catalog_are_required_up_front_but_child_calls_need_none(env: Env) -> None:
    """A missing catalog handler is refused before anything is written; the call node itself is not flagged."""
    assert env.registry.missing(ci()) == ["scan@1"]
    with pytest.raises(HandlerUnavailable, match="scan@1"):
        env.runtime().execute(ci(), {"repo": "acme/app"})
    env.scan(SCAN_OK)
    assert env.registry.missing(ci()) == []


# -- current-task mode ---------------------------------------------------------------


def test_execute_in_current_task_drives_the_child_inline(env: Env) -> None:
    """Inside a hub task the child run is driven inline, serially with the parent's other work."""
    order: list[str] = []

    def scan(req: HandlerRequest) -> Succeeded:
        order.append("scan")
        sleep(1)
        return SCAN_OK

    env.registry.register("scan", 1, scan, cooperative=True)
    env.registry.register("other", 1, lambda req: order.append("other") or Succeeded(), cooperative=True)
    spec = WorkflowSpec(
        "acme.ci",
        1,
        (Node("lint", child=lint_call()), Node("other", handler="other@1")),
        catalog=(LINT,),
    )
    runtime = env.runtime()
    result = Hub(VirtualClock()).run(runtime.execute_in_current_task, spec, {"repo": "acme/app"})
    assert result.succeeded
    assert result.outputs["lint"] == {"warnings": 2}
    assert order == ["scan", "other"]  # the child ran to its end before the next node started


def test_current_task_mode_refuses_catalog_workflows_with_attempt_deadlines(env: Env) -> None:
    """A child run is driven inline too, so a catalog node with a deadline is refused up front."""
    timed = ChildDefinition(
        workflow_id="acme.lint",
        version=1,
        nodes=(
            Node("scan", handler="scan@1", retry=RetryPolicy(attempt_deadline_ms=10), outputs=("warnings",)),
        ),
        inputs=("repo",),
        outputs=("warnings",),
    )
    env.scan(SCAN_OK)
    with pytest.raises(UnsupportedInCurrentTask, match=r"acme\.lint@1/scan"):
        Hub().run(env.runtime().execute_in_current_task, lint_only((timed,)), {"repo": "r"})


# -- recovery ------------------------------------------------------------------------


def started_parent(env: Env, ids: mayfly.ids.DeterministicIdSource) -> tuple[RunState, ChildStarted]:
    """A parent run whose lint attempt recorded ChildStarted, as a process leaves it when it stops there."""
    run_id = ids.new_id()
    state = commit_command(
        env.journal, None, CreateRun(run_id=run_id, spec=lint_only(), input={"repo": "acme/app"}), ids=ids
    ).state
    commit = commit_command(
        env.journal,
        state,
        StartNodes((AttemptStart("lint", ids.new_id(), child_run_id=ids.new_id()),)),
        ids=ids,
    )
    (started,) = [e for e in commit.events if isinstance(e, ChildStarted)]
    return commit.state, started


def test_recovery_reconciles_a_started_child_call(env: Env) -> None:
    """A running child-call attempt yields ReconcileChild with its attempt and child run ids, never Blocked."""
    parent, started = started_parent(env, mayfly.ids.DeterministicIdSource(31))
    env.scan(Succeeded())  # the called workflow's handler; the call itself needs none of its own
    check_unfinished_handlers(parent, env.registry.is_available)
    assert recovery_effects(parent) == (ReconcileChild("lint", started.attempt_id, started.child_run_id),)


def test_resume_creates_a_child_the_parent_started_but_never_created(env: Env) -> None:
    """Crash between ChildStarted and the child's RunCreated: resume creates the child and finishes both."""
    parent, started = started_parent(env, mayfly.ids.DeterministicIdSource(32))
    assert env.journal.read(started.child_run_id) == []
    env.scan(SCAN_OK)
    result = env.runtime().resume(parent.run_id)
    assert result.succeeded and result.outputs == {"lint": {"warnings": 2}}
    assert result.nodes["lint"].attempts == 1  # the started attempt is finished, not replaced
    created = env.events(started.child_run_id)[0]
    assert isinstance(created, RunCreated) and created.input == {"repo": "acme/app"}
    assert created.parent is not None and created.parent.attempt_id == started.attempt_id


def test_resume_resumes_a_child_that_was_running_when_the_process_stopped(env: Env) -> None:
    """Crash while the child runs: resuming the parent re-invokes the child's attempt under its original id."""
    ids = mayfly.ids.DeterministicIdSource(33)
    parent, started = started_parent(env, ids)
    child = commit_command(env.journal, None, child_create_run(parent, started), ids=ids).state
    scan_attempt = ids.new_id()
    commit_command(env.journal, child, StartNodes((AttemptStart("scan", scan_attempt),)), ids=ids)
    env.scan(SCAN_OK)
    result = env.runtime().resume(parent.run_id)
    assert result.succeeded and result.outputs == {"lint": {"warnings": 2}}
    (request,) = env.seen
    assert (request.run_id, request.attempt_id) == (started.child_run_id, scan_attempt)
    assert env.state(started.child_run_id).status is RunStatus.SUCCEEDED


def test_resume_completes_the_parent_of_a_child_that_had_already_finished(env: Env) -> None:
    """A child that ended before the crash is reported to its parent at once, without running anything."""
    ids = mayfly.ids.DeterministicIdSource(34)
    parent, started = started_parent(env, ids)
    child = commit_command(env.journal, None, child_create_run(parent, started), ids=ids).state
    scan_attempt = ids.new_id()
    child = commit_command(
        env.journal, child, StartNodes((AttemptStart("scan", scan_attempt),)), ids=ids
    ).state
    commit_command(env.journal, child, CompleteAttempt("scan", scan_attempt, SCAN_OK), ids=ids)
    env.scan(SCAN_OK)
    result = env.runtime().resume(parent.run_id)
    assert result.succeeded and result.outputs == {"lint": {"warnings": 2}}
    assert env.seen == []


def test_resume_in_current_task_finishes_a_child_inline(env: Env) -> None:
    """The current-task mode resumes an interrupted child run inline and completes its parent."""
    ids = mayfly.ids.DeterministicIdSource(39)
    parent, started = started_parent(env, ids)
    commit_command(env.journal, None, child_create_run(parent, started), ids=ids)
    env.scan(SCAN_OK)
    result = Hub().run(env.runtime().resume_in_current_task, parent.run_id)
    assert result.succeeded and result.outputs == {"lint": {"warnings": 2}}
    assert [r.run_id for r in env.seen] == [started.child_run_id]


def test_resume_refuses_a_child_id_that_names_a_run_of_another_parent(env: Env) -> None:
    """If the recorded child run id holds a run that is not this call's child, resume fails closed."""
    ids = mayfly.ids.DeterministicIdSource(40)
    parent, started = started_parent(env, ids)
    # A root run squatting on the child's id: its parent link is missing.
    commit_command(env.journal, None, CreateRun(run_id=started.child_run_id, spec=lint_only()), ids=ids)
    env.scan(SCAN_OK)
    with pytest.raises(CorruptionError, match=f"run {started.child_run_id} is not the child of run"):
        env.runtime().resume(parent.run_id)
    assert env.state(parent.run_id).node_by_id("lint").status is NodeStatus.RUNNING  # type: ignore[union-attr]


CRASH_WORKER = """
import sys, time
from mayfly import ChildCall, ChildDefinition, HandlerRegistry, Node, Succeeded, WorkflowRuntime, WorkflowSpec
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal

url, run_id, marker = sys.argv[1:4]

def scan(req):
    with open(marker, "a") as log:
        log.write(f"{req.run_id} {req.attempt_id}\\n")
    time.sleep(3600)  # killed here, with the child's scan attempt durably started

registry = HandlerRegistry()
registry.register("scan", 1, scan)
lint = ChildDefinition("acme.lint", 1, (Node("scan", handler="scan@1", outputs=("warnings",)),),
                       inputs=("repo",), outputs=("warnings",))
spec = WorkflowSpec("acme.ci", 1, (Node("lint", child=ChildCall("acme.lint", 1, "require_success",
                    ("repo",), ("warnings",))),), catalog=(lint,))
runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url), owner="doomed")
runtime.execute(spec, {"repo": "acme/app"}, run_id=run_id)
"""


def test_sigkill_while_the_child_runs_then_another_process_resumes_both(env: Env, tmp_path: Path) -> None:
    """A process killed inside the child's handler leaves both runs open; resuming the parent elsewhere ends both."""
    run_id = mayfly.ids.DeterministicIdSource(41).new_id()
    marker = tmp_path / "scan.log"
    worker = subprocess.Popen(
        [sys.executable, "-c", CRASH_WORKER, env.url, run_id, str(marker)], stderr=subprocess.PIPE, text=True
    )
    started = time.monotonic()
    while not (marker.exists() and marker.read_text().endswith("\n")):
        assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
        assert time.monotonic() - started < 60, "the worker never reached the child's handler"
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    child_id, scan_attempt = marker.read_text().split()
    assert env.state(run_id).status is RunStatus.RUNNING
    assert env.state(child_id).status is RunStatus.RUNNING

    env.scan(SCAN_OK)
    result = env.runtime(owner="survivor").resume(run_id)
    assert result.succeeded and result.outputs == {"lint": {"warnings": 2}}
    assert result.nodes["lint"].child_run_id == child_id and result.nodes["lint"].attempts == 1
    (request,) = env.seen
    assert (request.run_id, request.attempt_id) == (child_id, scan_attempt)  # same attempt, reconciled
    assert env.state(child_id).status is RunStatus.SUCCEEDED


# -- cancellation ----------------------------------------------------------------------


def long_scan(env: Env, observed: list[bool]) -> None:
    def scan(req: HandlerRequest) -> Succeeded:
        env.seen.append(req)
        try:
            sleep(3600)
        finally:
            observed.append(req.cancelled)
        return SCAN_OK

    env.registry.register("scan", 1, scan, cooperative=True)


def cancellation_of(env: Env, run_id: str) -> CancellationRequested:
    (cancelled,) = [e for e in env.events(run_id) if isinstance(e, CancellationRequested)]
    return cancelled


def stopper(env: Env, runtime: WorkflowRuntime) -> None:
    """Register stop@1: five seconds in, it cancels its own run."""

    @env.registry.handler("stop", cooperative=True)
    def stop(req: HandlerRequest) -> Any:
        sleep(5)
        runtime.cancel(req.run_id, reason="operator", requester="alice")
        sleep(3600)
        return Succeeded()


def test_cancelling_the_parent_cancels_its_running_child_run(env: Env) -> None:
    """The child's history records CancellationRequested naming the parent run and node as requester."""
    observed: list[bool] = []
    long_scan(env, observed)
    runtime = env.runtime(clock=VirtualClock)
    stopper(env, runtime)
    spec = WorkflowSpec(
        "acme.ci", 1, (Node("lint", child=lint_call()), Node("stop", handler="stop@1")), catalog=(LINT,)
    )
    result = runtime.execute(spec, {"repo": "acme/app"})
    assert result.status is RunStatus.CANCELLED
    assert result.nodes["lint"].status is NodeStatus.CANCELLED
    child_id = str(result.nodes["lint"].child_run_id)
    parent_cancel = cancellation_of(env, result.run_id)
    assert [t.child_run_id for t in parent_cancel.targets if t.node_id == "lint"] == [child_id]
    child_cancel = cancellation_of(env, child_id)
    assert child_cancel.requester == f"parent {result.run_id}/lint"
    assert child_cancel.reason == f"parent run {result.run_id} cancelled: operator"
    assert env.state(child_id).status is RunStatus.CANCELLED
    assert observed == [True]  # the child's handler saw the cancellation


def test_cancellation_cascades_to_grandchildren(env: Env) -> None:
    """Cancelling the root cancels the child, which in turn cancels the grandchild, each naming its parent."""
    observed: list[bool] = []
    long_scan(env, observed)
    runtime = env.runtime(clock=VirtualClock)
    stopper(env, runtime)
    root = WorkflowSpec(
        "acme.ci",
        1,
        (
            Node("gate", child=ChildCall("acme.gate", 1, "propagate", ("repo",), ("warnings",))),
            Node("stop", handler="stop@1"),
        ),
        catalog=(LINT, GATE),
    )
    result = runtime.execute(root, {"repo": "r"})
    assert result.status is RunStatus.CANCELLED
    child_id = str(result.nodes["gate"].child_run_id)
    grandchild_id = inspect_child_id(env.state(child_id), "inner")
    assert cancellation_of(env, child_id).requester == f"parent {result.run_id}/gate"
    assert cancellation_of(env, grandchild_id).requester == f"parent {child_id}/inner"
    assert env.state(child_id).status is RunStatus.CANCELLED
    assert env.state(grandchild_id).status is RunStatus.CANCELLED
    assert observed == [True]


def test_cancel_in_current_task_mode_reaches_the_inline_child_between_its_handlers(env: Env) -> None:
    """In current-task mode the parent is busy driving its child inline, so the cancel is forwarded down.

    Handlers run inline there too, so, as for a root run, it takes effect
    between handlers: the grandchild's running scan finishes, its next node
    never starts.
    """
    ran: list[str] = []

    def step(req: HandlerRequest) -> Succeeded:
        ran.append(req.node_id)
        sleep(60)
        return SCAN_OK

    env.registry.register("scan", 1, step, cooperative=True)
    env.registry.register("publish", 1, step, cooperative=True)
    two_steps = ChildDefinition(
        workflow_id="acme.lint",
        version=1,
        nodes=(
            Node("scan", handler="scan@1", outputs=("warnings",)),
            Node("publish", handler="publish@1", depends_on=("scan",)),
        ),
        inputs=("repo",),
        outputs=("warnings",),
    )
    runtime = env.runtime()
    results: list[mayfly.RunResult] = []
    run_id = mayfly.ids.DeterministicIdSource(35).new_id()
    root = WorkflowSpec(
        "acme.ci",
        1,
        (Node("gate", child=ChildCall("acme.gate", 1, "propagate", ("repo",), ("warnings",))),),
        catalog=(two_steps, GATE),
    )

    def main() -> None:
        task = spawn(
            lambda: results.append(runtime.execute_in_current_task(root, {"repo": "r"}, run_id=run_id))
        )
        sleep(5)
        runtime.cancel(run_id, reason="operator")
        task.join()

    Hub(VirtualClock()).run(main)
    (result,) = results
    assert result.status is RunStatus.CANCELLED
    assert result.nodes["gate"].status is NodeStatus.CANCELLED
    assert ran == ["scan"]
    child_id = str(result.nodes["gate"].child_run_id)
    grandchild_id = inspect_child_id(env.state(child_id), "inner")
    assert cancellation_of(env, child_id).requester == f"parent {run_id}/gate"
    assert cancellation_of(env, grandchild_id).requester == f"parent {child_id}/inner"
    grandchild = env.state(grandchild_id)
    assert grandchild.status is RunStatus.CANCELLED
    assert grandchild.node_by_id("scan").status is NodeStatus.SUCCEEDED  # type: ignore[union-attr]
    assert grandchild.node_by_id("publish").status is NodeStatus.CANCELLED  # type: ignore[union-attr]


def test_a_child_call_attempt_closed_by_its_deadline_cancels_the_child(env: Env) -> None:
    """When the parent's attempt deadline closes a child-call attempt, the child run is cancelled too."""
    observed: list[bool] = []
    long_scan(env, observed)
    spec = ci(retry=RetryPolicy(max_attempts=1, attempt_deadline_ms=60_000))
    result = env.runtime(clock=VirtualClock).execute(spec, {"repo": "acme/app"})
    lint = result.nodes["lint"]
    assert lint.status is NodeStatus.FAILED and "attempt deadline" in lint.reason
    child_id = str(lint.child_run_id)
    child_cancel = cancellation_of(env, child_id)
    assert child_cancel.requester == f"parent {result.run_id}/lint"
    assert child_cancel.reason.startswith("parent attempt closed: retryable_failure")
    assert env.state(child_id).status is RunStatus.CANCELLED
    assert observed == [True]


def test_a_run_budget_that_runs_out_cancels_the_open_child_run(env: Env) -> None:
    """When the parent's elapsed-time budget ends the run, its open child run is cancelled too."""
    observed: list[bool] = []
    long_scan(env, observed)
    spec = msgspec.structs.replace(ci(), budgets=mayfly.RunBudgets(max_elapsed_ms=60_000))
    result = env.runtime(clock=VirtualClock).execute(spec, {"repo": "acme/app"})
    assert result.status is RunStatus.FAILED
    lint = result.nodes["lint"]
    assert lint.status is NodeStatus.CANCELLED
    child_cancel = cancellation_of(env, str(lint.child_run_id))
    assert child_cancel.requester == f"parent {result.run_id}/lint"
    assert child_cancel.reason == "parent attempt closed: cancelled (run budget exhausted (run_elapsed))"
    assert env.state(str(lint.child_run_id)).status is RunStatus.CANCELLED
    assert observed == [True]


def test_a_retried_child_call_starts_a_fresh_child_run_after_cancelling_the_timed_out_one(env: Env) -> None:
    """A deadline retry is a new parent attempt with a new child run; the timed-out child is cancelled."""
    calls: list[str] = []

    def scan(req: HandlerRequest) -> Succeeded:
        calls.append(req.run_id)
        if len(calls) == 1:
            sleep(3600)  # the first child outlives the parent attempt's deadline
        return SCAN_OK

    env.registry.register("scan", 1, scan, cooperative=True)
    retry = RetryPolicy(max_attempts=2, attempt_deadline_ms=60_000, backoff=mayfly.ImmediateBackoff())
    result = env.runtime(clock=VirtualClock).execute(ci(retry=retry), {"repo": "acme/app"})
    assert result.succeeded and result.outputs["lint"] == {"warnings": 2}
    assert result.nodes["lint"].attempts == 2
    first, second = calls
    assert first != second and result.nodes["lint"].child_run_id == second
    assert env.state(first).status is RunStatus.CANCELLED
    assert cancellation_of(env, first).requester == f"parent {result.run_id}/lint"
    assert env.state(second).status is RunStatus.SUCCEEDED


def test_independent_child_calls_run_concurrently(env: Env) -> None:
    """Two child calls without a dependency overlap: each child's 60 s handler ends at 60 s of virtual time."""
    ends: list[int] = []

    def scan(req: HandlerRequest) -> Succeeded:
        sleep(60)
        ends.append(mayfly.substrate.now_ms())
        return SCAN_OK

    env.registry.register("scan", 1, scan, cooperative=True)
    spec = WorkflowSpec(
        "acme.ci",
        1,
        (Node("lint_a", child=lint_call()), Node("lint_b", child=lint_call())),
        catalog=(LINT,),
    )
    result = env.runtime(clock=VirtualClock).execute(spec, {"repo": "acme/app"})
    assert result.succeeded
    assert result.nodes["lint_a"].child_run_id != result.nodes["lint_b"].child_run_id
    assert ends == [60_000, 60_000]


# -- signals inside a child ------------------------------------------------------------

TOKENS: dict[str, str] = {}


def approving_scan(req: HandlerRequest) -> Any:
    if req.signal is None:
        token = new_signal_token()
        TOKENS[req.run_id] = token.reveal()
        return WaitForSignal("approval", token)
    return Succeeded(output={"warnings": req.signal.decision["warnings"]})


def test_a_child_parked_on_a_signal_parks_its_parent_and_resuming_the_parent_finishes_both(env: Env) -> None:
    """execute returns with the child's wait as "lint/scan"; signal the child, resume the parent: both end."""
    env.scan(approving_scan)
    parked = env.runtime().execute(ci(), {"repo": "acme/app"})
    assert parked.status is RunStatus.RUNNING
    assert parked.waiting == {"lint/scan": "approval"}
    assert parked.nodes["lint"].status is NodeStatus.RUNNING
    child_id = str(parked.nodes["lint"].child_run_id)
    assert env.state(child_id).status is RunStatus.RUNNING

    # Resuming before the signal arrives parks both again; nothing is re-run or duplicated.
    again = env.runtime().resume(parked.run_id)
    assert again.waiting == {"lint/scan": "approval"} and again.nodes["lint"].child_run_id == child_id

    later = env.runtime()
    disposition = later.signal(child_id, "scan", TOKENS[child_id], {"warnings": 0})
    assert disposition.status == "accepted"
    done = later.resume(parked.run_id)
    assert done.status is RunStatus.SUCCEEDED
    assert done.outputs == {"checkout": None, "lint": {"warnings": 0}, "report": {"warnings": 0}}
    assert done.waiting == {}
    assert done.nodes["lint"].attempts == 1
    assert env.state(child_id).nodes[0].total_attempts == 1  # the same scan attempt resumed


def test_a_signal_to_a_child_reaches_its_nested_driver_while_the_parent_runs(env: Env) -> None:
    """Without detaching, a signal addressed to the child run from another task resumes it in place."""
    env.scan(approving_scan)
    runtime = env.runtime()
    results: list[mayfly.RunResult] = []
    run_id = mayfly.ids.DeterministicIdSource(36).new_id()

    def main() -> None:
        task = spawn(
            lambda: results.append(runtime.execute_in_current_task(ci(), {"repo": "r"}, run_id=run_id))
        )
        while not env.seen or not env.state(env.seen[0].run_id).waiting_nodes():
            sleep(0.01)  # until the child's scan has durably opened its wait
        child_id = env.seen[0].run_id
        assert runtime.signal(child_id, "scan", TOKENS[child_id], {"warnings": 7}).status == "accepted"
        task.join()

    Hub().run(main)
    (result,) = results
    assert result.succeeded and result.outputs["lint"] == {"warnings": 7}


def test_cancel_run_cascade_cancels_a_parked_root_and_its_parked_child(env: Env) -> None:
    """With no live driver (both parked), cancelling the root through its journal cascades to the child."""
    env.scan(approving_scan)
    parked = env.runtime().execute(ci(), {"repo": "acme/app"})
    child_id = str(parked.nodes["lint"].child_run_id)
    cancel_run_cascade(
        env.journal,
        env.leases,
        parked.run_id,
        requester="ops",
        reason="abandoned",
        owner="test-owner",
        ids=mayfly.ids.DeterministicIdSource(37),
    )
    assert env.state(parked.run_id).status is RunStatus.CANCELLED
    assert cancellation_of(env, parked.run_id).requester == "ops"
    child_cancel = cancellation_of(env, child_id)
    assert child_cancel.requester == f"parent {parked.run_id}/lint"
    assert child_cancel.reason == f"parent run {parked.run_id} cancelled: abandoned"
    assert env.state(child_id).status is RunStatus.CANCELLED


def test_resuming_a_parent_cancelled_without_cascade_cancels_its_open_child(env: Env) -> None:
    """A parent cancelled by a bare CancelRun (as `mayfly cancel` does) cancels its child when resumed."""
    env.scan(approving_scan)
    parked = env.runtime().execute(ci(), {"repo": "acme/app"})
    child_id = str(parked.nodes["lint"].child_run_id)
    with env.leases.acquire(parked.run_id, "mayfly-cli", 30_000) as lease:
        commit_command(
            env.journal,
            env.state(parked.run_id),
            CancelRun("ops", "abandoned"),
            ids=mayfly.ids.DeterministicIdSource(38),
            fence=lease.fencing_token,
        )
    assert env.state(child_id).status is RunStatus.RUNNING  # nothing cascaded yet
    result = env.runtime().resume(parked.run_id)
    assert result.status is RunStatus.CANCELLED and result.waiting == {}
    assert cancellation_of(env, child_id).requester == f"parent {parked.run_id}/lint"
    assert env.state(child_id).status is RunStatus.CANCELLED
