"""Run time across downtime (ARCHITECTURE section 11): VirtualTime is the wall time since the run's epoch."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import mayfly
from mayfly import (
    ChildCall,
    ChildDefinition,
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.commit import commit_command
from mayfly.identity import Uuid7IdSource
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CreateRun, OpenSignalWait, StartNodes
from mayfly.model.errors import CommandRejected
from mayfly.model.events import (
    AttemptDeadlineExpired,
    NodeOutcomeCommitted,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
    RunCreated,
    SignalExpired,
    SignalWaitOpened,
    VirtualTimeAdvanced,
)
from mayfly.model.state import NodeStatus, RunState
from mayfly.recovery import inspect_run
from mayfly.reducer import decode_event
from mayfly.runtime import WaitForSignal, new_signal_token
from mayfly.substrate import VirtualClock, sleep

WORKER = Path(__file__).with_name("time_worker.py")
sys.path.insert(0, str(WORKER.parent))
import time_worker  # noqa: E402


class Env:
    def __init__(self, root: Path) -> None:
        self.url = f"file://{root}/journal?durability=write"
        self.journal = LocalWorkflowJournal(self.url)
        self.leases = LocalLeaseStore(self.url)
        self.registry = HandlerRegistry()
        self.tokens: dict[str, str] = {}
        self.calls: list[tuple[str, int, str]] = []

    def runtime(self, wall_origin_ms: int = 0, **kwargs: Any) -> WorkflowRuntime:
        """A runtime on a fresh VirtualClock whose wall reading starts at ``wall_origin_ms``."""
        return WorkflowRuntime(
            self.journal,
            self.registry,
            leases=self.leases,
            clock=lambda: VirtualClock(wall_origin_ms=wall_origin_ms),
            **kwargs,
        )

    def waiter(self, timeout_ms: int) -> None:
        """Register wait@1: every invocation without a signal opens a wait of ``timeout_ms``."""

        def wait(req: HandlerRequest) -> Any:
            self.calls.append((req.node_id, req.attempt, req.attempt_id))
            if req.signal is None:
                token = new_signal_token()
                self.tokens[req.node_id] = token.reveal()
                return WaitForSignal("approval", token, timeout_ms=timeout_ms)
            return Succeeded(output=req.signal.decision)

        self.registry.register("wait", 1, wait)

    def events(self, run_id: str, after: int = 0) -> list[Any]:
        records = self.journal.read(run_id, after=after)
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in records]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def spec(*nodes: Node, **kwargs: Any) -> WorkflowSpec:
    return WorkflowSpec(workflow_id="time.test", version=1, nodes=nodes, **kwargs)


def facts(events: list[Any]) -> list[tuple[Any, ...]]:
    """The timing-relevant facts, as (type, node, time) tuples."""
    shown: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, VirtualTimeAdvanced):
            shown.append(("VirtualTimeAdvanced", e.to))
        elif isinstance(e, SignalExpired | AttemptDeadlineExpired):
            shown.append((type(e).__name__, e.node_id, e.deadline))
        elif isinstance(e, RetryScheduled):
            shown.append(("RetryScheduled", e.node_id, e.deadline))
        elif isinstance(e, RetryReleased):
            shown.append(("RetryReleased", e.node_id, e.at))
        elif isinstance(e, NodeStarted):
            shown.append(("NodeStarted", e.node_id, e.attempt))
        elif isinstance(e, SignalWaitOpened):
            shown.append(("SignalWaitOpened", e.node_id, e.deadline))
        elif isinstance(e, NodeOutcomeCommitted):
            shown.append(("NodeOutcomeCommitted", e.node_id, e.outcome.kind.value))
    return shown


def test_a_wait_whose_deadline_passed_while_no_process_ran_has_expired_when_resumed(tmp_path: Path) -> None:
    """A run parks on a 2 s approval, its process exits, and a resume 3 s later finds the wait expired."""
    url = f"file://{tmp_path}/journal?durability=fsync"
    run_id = Uuid7IdSource().new_id()
    before_ms = time.time_ns() // 1_000_000
    parked = subprocess.run(
        [sys.executable, str(WORKER), url, run_id], check=False, capture_output=True, text=True, timeout=60
    )
    assert parked.returncode == 0, parked.stderr
    assert parked.stdout.splitlines()[-1] == "parked approval"
    parked_at = time.time_ns() // 1_000_000
    (opened,) = [e for e in Env(tmp_path).events(run_id) if isinstance(e, SignalWaitOpened)]
    assert opened.deadline == opened.at + time_worker.DEADLINE_MS

    time.sleep(3)
    result = time_worker.runtime(url).resume(run_id)

    assert result.status is RunStatus.FAILED and result.waiting == {}
    assert result.nodes["approval"].status is NodeStatus.FAILED
    (created,) = [e for e in Env(tmp_path).events(run_id)[:1] if isinstance(e, RunCreated)]
    assert created.epoch_ms is not None and before_ms <= created.epoch_ms <= parked_at
    history = facts(Env(tmp_path).events(run_id))
    expired = history.index(("SignalExpired", "approval", opened.deadline))
    # The wait expired at its own deadline, through the facts a live timer records, and the run
    # (which may not retry) ended there.
    assert history[expired - 1] == ("VirtualTimeAdvanced", opened.deadline)
    assert history[expired + 1] == ("NodeOutcomeCommitted", "approval", "retryable_failure")
    assert inspect_run(LocalWorkflowJournal(url), run_id).state.now == opened.deadline


def test_deadlines_passed_while_nothing_ran_fire_in_order_each_at_its_own_time(env: Env) -> None:
    """Two expiries and the retries they schedule fire deadline by deadline, as live timers would."""
    retry = RetryPolicy(max_attempts=2, backoff=FixedBackoff(delay_ms=500))
    two_waits = spec(Node("w1", handler="wait@1", retry=retry), Node("w2", handler="wait@1", retry=retry))

    @env.registry.handler("wait")
    def wait(req: HandlerRequest) -> Any:  # w1 waits 2 s, w2 4 s
        timeout = 4_000 if req.node_id == "w2" else 2_000
        return WaitForSignal("approval", new_signal_token(), timeout_ms=timeout)

    parked = env.runtime(wall_origin_ms=0).execute(two_waits)
    assert parked.waiting == {"w1": "approval", "w2": "approval"}
    seen = parked.sequence

    # The next process starts 10 s (of wall time) later, with no process in between.
    resumed = env.runtime(wall_origin_ms=10_000).resume(parked.run_id)

    assert resumed.waiting == {"w1": "approval", "w2": "approval"}
    seen_facts = facts(env.events(parked.run_id, after=seen))
    # The two retries run at once, so which one opens its wait first is up to the scheduler.
    assert sorted(seen_facts[-2:]) == [("SignalWaitOpened", "w1", 12_000), ("SignalWaitOpened", "w2", 14_000)]
    assert seen_facts[:-2] == [
        ("VirtualTimeAdvanced", 2_000),
        ("SignalExpired", "w1", 2_000),
        ("NodeOutcomeCommitted", "w1", "retryable_failure"),
        ("RetryScheduled", "w1", 2_500),
        ("VirtualTimeAdvanced", 2_500),
        ("RetryReleased", "w1", 2_500),
        ("VirtualTimeAdvanced", 4_000),
        ("SignalExpired", "w2", 4_000),
        ("NodeOutcomeCommitted", "w2", "retryable_failure"),
        ("RetryScheduled", "w2", 4_500),
        ("VirtualTimeAdvanced", 4_500),
        ("RetryReleased", "w2", 4_500),
        ("VirtualTimeAdvanced", 10_000),
        ("NodeStarted", "w1", 2),
        ("NodeStarted", "w2", 2),
    ]


def test_an_in_flight_attempt_whose_deadline_passed_meanwhile_is_expired_not_re_invoked(env: Env) -> None:
    """The attempt a dead process left running times out at its deadline; only its retry is invoked."""
    env.registry.register(
        "work", 1, lambda req: env.calls.append((req.node_id, req.attempt, "")) or Succeeded()
    )
    timed = spec(Node("work", handler="work@1", retry=RetryPolicy(attempt_deadline_ms=1_000)))
    ids = mayfly.ids.DeterministicIdSource(5)
    run_id = ids.new_id()
    state = commit_command(env.journal, None, CreateRun(run_id=run_id, spec=timed, epoch_ms=0), ids=ids).state
    commit_command(env.journal, state, StartNodes((AttemptStart("work", ids.new_id()),)), ids=ids)
    seen = len(env.journal.read(run_id))

    result = env.runtime(wall_origin_ms=5_000).resume(run_id)

    assert result.status is RunStatus.SUCCEEDED
    assert env.calls == [("work", 2, "")]
    assert facts(env.events(run_id, after=seen))[:7] == [
        ("VirtualTimeAdvanced", 1_000),
        ("AttemptDeadlineExpired", "work", 1_000),
        ("NodeOutcomeCommitted", "work", "retryable_failure"),
        ("RetryScheduled", "work", 2_000),  # the default backoff, counted from the expiry
        ("VirtualTimeAdvanced", 2_000),
        ("RetryReleased", "work", 2_000),
        ("VirtualTimeAdvanced", 5_000),
    ]


def test_a_wall_clock_that_jumped_backwards_never_moves_virtual_time_back(env: Env) -> None:
    """A later process whose wall clock reads before the run's epoch keeps the recorded virtual time."""

    @env.registry.handler("prep", cooperative=True)
    def prep(req: HandlerRequest) -> Succeeded:
        sleep(1.5)
        return Succeeded()

    env.waiter(timeout_ms=2_000)
    flow = spec(Node("prep", handler="prep@1"), Node("gate", handler="wait@1", depends_on=("prep",)))
    parked = env.runtime(wall_origin_ms=50_000).execute(flow)
    assert inspect_run(env.journal, parked.run_id).state.now == 1_500

    again = env.runtime(wall_origin_ms=20_000).resume(parked.run_id)  # 30 s before the epoch

    assert again.waiting == {"gate": "approval"} and again.sequence == parked.sequence  # nothing written
    state = inspect_run(env.journal, parked.run_id).state
    assert state.now == 1_500
    from mayfly.runtime._time import run_time_at

    assert run_time_at(state, wall_ms=0) == run_time_at(state, wall_ms=51_000) == 1_500
    assert run_time_at(state, wall_ms=53_000) == 3_000


def test_a_run_recorded_without_an_epoch_counts_only_driven_time(env: Env) -> None:
    """Runs created before epochs existed keep their old behaviour: downtime does not count."""
    env.waiter(timeout_ms=2_000)
    ids = mayfly.ids.DeterministicIdSource(6)

    def parked_run(epoch_ms: int | None) -> str:
        run_id = ids.new_id()
        flow = spec(Node("gate", handler="wait@1", retry=RetryPolicy(max_attempts=1)))
        create = CreateRun(run_id=run_id, spec=flow, epoch_ms=epoch_ms)
        state: RunState = commit_command(env.journal, None, create, ids=ids).state
        attempt = ids.new_id()
        state = commit_command(
            env.journal, state, StartNodes((AttemptStart("gate", attempt),)), ids=ids
        ).state
        wait = OpenSignalWait(
            node_id="gate",
            attempt_id=attempt,
            name="approval",
            token_sha256="sha256:" + "0" * 64,
            timeout_ms=2_000,
        )
        commit_command(env.journal, state, wait, ids=ids)
        return run_id

    legacy, current = parked_run(None), parked_run(0)
    assert env.runtime(wall_origin_ms=1_000_000).resume(legacy).waiting == {"gate": "approval"}
    assert inspect_run(env.journal, legacy).state.now == 0
    assert env.runtime(wall_origin_ms=1_000_000).resume(current).status is RunStatus.FAILED


def test_a_signal_sent_after_the_deadline_passed_while_nothing_ran_finds_the_wait_expired(env: Env) -> None:
    """Delivering to a parked run first brings its time up to date: a late approval is rejected as expired."""
    env.waiter(timeout_ms=2_000)
    env.registry.register("hold", 1, lambda req: WaitForSignal("release", new_signal_token()))
    flow = spec(
        Node("gate", handler="wait@1", retry=RetryPolicy(max_attempts=1)),
        Node("hold", handler="hold@1"),  # keeps the run open after the gate fails
    )
    late_run = env.runtime(wall_origin_ms=0).execute(flow)
    late_token = env.tokens["gate"]
    on_time_run = env.runtime(wall_origin_ms=0).execute(flow)

    before = env.journal.read(late_run.run_id)
    with pytest.raises(CommandRejected, match="unknown_node"):  # refused input still writes nothing
        env.runtime(wall_origin_ms=3_000).signal(late_run.run_id, "nosuch", late_token, "approve")
    assert env.journal.read(late_run.run_id) == before

    late = env.runtime(wall_origin_ms=3_000).signal(late_run.run_id, "gate", late_token, "approve")
    assert (late.status, late.reason) == ("rejected", "expired")
    assert inspect_run(env.journal, late_run.run_id).state.node_by_id("gate").status is NodeStatus.FAILED  # type: ignore[union-attr]

    on_time = env.runtime(wall_origin_ms=1_999).signal(
        on_time_run.run_id, "gate", env.tokens["gate"], "approve"
    )
    assert on_time.status == "accepted"
    resumed = env.runtime(wall_origin_ms=1_999).resume(on_time_run.run_id)
    assert resumed.nodes["gate"].status is NodeStatus.SUCCEEDED


def test_the_epoch_is_the_clock_wall_reading_when_each_run_is_created(env: Env) -> None:
    """RunCreated records the injected clock's wall time: the root's at execute, a child's at its start."""

    @env.registry.handler("prep", cooperative=True)
    def prep(req: HandlerRequest) -> Succeeded:
        sleep(0.25)
        return Succeeded()

    env.registry.register("scan", 1, lambda req: Succeeded())
    lint = ChildDefinition("acme.lint", 1, (Node("scan", handler="scan@1"),))
    flow = spec(
        Node("prep", handler="prep@1"),
        Node("lint", child=ChildCall("acme.lint", 1, "propagate"), depends_on=("prep",)),
        catalog=(lint,),
    )
    result = env.runtime(wall_origin_ms=7_000_000).execute(flow)
    assert result.status is RunStatus.SUCCEEDED
    child_run = result.nodes["lint"].child_run_id
    assert child_run is not None
    (root_created,) = [e for e in env.events(result.run_id) if isinstance(e, RunCreated)]
    (child_created,) = [e for e in env.events(child_run) if isinstance(e, RunCreated)]
    assert root_created.epoch_ms == 7_000_000
    assert child_created.epoch_ms == 7_000_250
    # A fresh run starts at virtual time 0: creating it records no time advance of its own.
    assert not any(isinstance(e, VirtualTimeAdvanced) for e in env.events(child_run))
    assert isinstance(env.events(child_run)[-1], RunCompleted)


def test_a_child_call_whose_deadline_passed_meanwhile_has_its_child_run_cancelled(env: Env) -> None:
    """Catching up closes a child-call attempt past its deadline; its child run is cancelled, not driven."""
    from mayfly.reducer.children import child_create_run

    env.registry.register(
        "scan", 1, lambda req: env.calls.append((req.node_id, req.attempt, "")) or Succeeded()
    )
    lint = ChildDefinition("acme.lint", 1, (Node("scan", handler="scan@1"),))
    call = Node(
        "lint",
        child=ChildCall("acme.lint", 1, "propagate"),
        retry=RetryPolicy(max_attempts=1, attempt_deadline_ms=1_000),
    )
    ids = mayfly.ids.DeterministicIdSource(9)
    run_id = ids.new_id()
    create = CreateRun(run_id=run_id, spec=spec(call, catalog=(lint,)), epoch_ms=0)
    state = commit_command(env.journal, None, create, ids=ids).state
    start = StartNodes((AttemptStart("lint", ids.new_id(), child_run_id=ids.new_id()),))
    commit = commit_command(env.journal, state, start, ids=ids)
    (started,) = [e for e in commit.events if type(e).__name__ == "ChildStarted"]
    child = msgspec.structs.replace(child_create_run(commit.state, started), epoch_ms=0)  # type: ignore[arg-type]
    commit_command(env.journal, None, child, ids=ids)

    result = env.runtime(wall_origin_ms=5_000).resume(run_id)

    assert result.status is RunStatus.FAILED
    assert ("AttemptDeadlineExpired", "lint", 1_000) in facts(env.events(run_id))
    assert env.calls == []  # the child run was never driven on
    cancelled = inspect_run(env.journal, child.run_id).state
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.cancellation is not None and cancelled.cancellation.requester == f"parent {run_id}/lint"
