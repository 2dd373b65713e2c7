"""WorkflowRuntime over the greenlet hub and the real local journal (ADR-0032 Story 1.9)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mayfly
from mayfly import (
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    ImmediateBackoff,
    Node,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.errors import HandlerUnavailable, HubNotRunning
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted
from mayfly.model.state import NodeStatus
from mayfly.reducer import decode_event
from mayfly.runtime import UnsupportedInCurrentTask
from mayfly.substrate import Hub, VirtualClock, sleep, spawn


def spec(*nodes: Node) -> WorkflowSpec:
    return WorkflowSpec(workflow_id="rt.test", version=1, nodes=nodes)


class Env:
    def __init__(self, root: Path) -> None:
        self.url = f"file://{root}/journal?durability=write"
        self.journal = LocalWorkflowJournal(self.url)
        self.leases = LocalLeaseStore(self.url)
        self.registry = HandlerRegistry()

    def runtime(self, **kwargs: Any) -> WorkflowRuntime:
        return WorkflowRuntime(self.journal, self.registry, leases=self.leases, **kwargs)

    def events(self, run_id: str) -> list[Any]:
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in self.journal.read(run_id)]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_offloaded_branches_overlap_in_time(env: Env) -> None:
    """Two independent blocking handlers run at the same time: each waits for the other at a barrier."""
    barrier = threading.Barrier(2, timeout=10)

    @env.registry.handler("wait")
    def wait(req: HandlerRequest) -> Succeeded:
        barrier.wait()  # raises BrokenBarrierError unless both handlers are inside at once
        return Succeeded(output=req.node_id)

    result = env.runtime().execute(spec(Node("a", handler="wait@1"), Node("b", handler="wait@1")))
    assert result.status is RunStatus.SUCCEEDED
    assert result.outputs == {"a": "a", "b": "b"}


def test_cooperative_branches_overlap_in_virtual_time(env: Env) -> None:
    """Two cooperative handlers sleeping 60 s each finish after 60 s of virtual time, not 120 s."""
    ends: list[int] = []

    @env.registry.handler("nap", cooperative=True)
    def nap(req: HandlerRequest) -> Succeeded:
        sleep(60)
        ends.append(mayfly.substrate.now_ms())
        return Succeeded()

    start = time.monotonic()
    result = env.runtime(clock=VirtualClock).execute(
        spec(Node("a", handler="nap@1"), Node("b", handler="nap@1"))
    )
    assert result.succeeded
    assert ends == [60_000, 60_000]
    assert time.monotonic() - start < 5


def test_all_ready_attempts_are_durably_started_before_any_runs(env: Env) -> None:
    """When the first handler runs, both NodeStarted facts are already in the journal."""
    seen: dict[str, set[str]] = {}

    @env.registry.handler("look")
    def look(req: HandlerRequest) -> Succeeded:
        records = env.journal.read(req.run_id)
        seen[req.node_id] = {
            e.node_id
            for e in (decode_event(r.event_type, r.schema_version, r.payload) for r in records)
            if isinstance(e, NodeStarted)
        }
        return Succeeded()

    env.runtime().execute(spec(Node("a", handler="look@1"), Node("b", handler="look@1")))
    assert seen == {"a": {"a", "b"}, "b": {"a", "b"}}


def test_a_handler_exception_becomes_a_typed_failure(env: Env) -> None:
    """An exception is recorded as a bounded RetryableFailure naming its type, then retried."""

    @env.registry.handler("explode")
    def explode(req: HandlerRequest) -> Succeeded:
        raise ConnectionError("upstream reset" + "!" * 10_000)

    result = env.runtime(clock=VirtualClock).execute(
        spec(Node("a", handler="explode@1", retry=RetryPolicy(max_attempts=2, backoff=ImmediateBackoff())))
    )
    summary = result.nodes["a"]
    assert result.status is RunStatus.FAILED
    assert summary.attempts == 2
    assert summary.outcome is mayfly.NodeOutcomeKind.RETRYABLE_FAILURE
    assert summary.reason.startswith("handler raised ConnectionError: upstream reset!!!")
    assert len(summary.reason.encode()) <= 4096


@pytest.mark.parametrize("cooperative", [False, True])
def test_an_exception_registered_as_non_retryable_fails_the_node_permanently(
    env: Env, cooperative: bool
) -> None:
    """A type named in non_retryable (or a subclass) is one PermanentFailure naming it; others still retry."""
    calls: list[str] = []

    @env.registry.handler("stock", non_retryable=(LookupError,), cooperative=cooperative)
    def stock(req: HandlerRequest) -> Succeeded:
        calls.append(req.node_id)
        if req.node_id == "bug":
            raise KeyError("sku")
        raise ConnectionError("reset")

    retry = RetryPolicy(max_attempts=3, backoff=ImmediateBackoff())
    result = env.runtime(clock=VirtualClock).execute(
        spec(Node("bug", handler="stock@1", retry=retry), Node("flaky", handler="stock@1", retry=retry))
    )
    assert (result.nodes["bug"].outcome, result.nodes["bug"].attempts) == (
        mayfly.NodeOutcomeKind.PERMANENT_FAILURE,
        1,
    )
    assert result.nodes["bug"].reason == "handler raised KeyError: 'sku'"
    assert (result.nodes["flaky"].outcome, result.nodes["flaky"].attempts) == (
        mayfly.NodeOutcomeKind.RETRYABLE_FAILURE,
        3,
    )
    assert calls.count("bug") == 1


class Discontinued(mayfly.NonRetryable):
    """A handler's own permanent error."""


@pytest.mark.parametrize("cooperative", [False, True])
def test_raising_non_retryable_fails_the_node_permanently_naming_the_cause(
    env: Env, cooperative: bool
) -> None:
    """mayfly.NonRetryable, or a subclass, is a bounded PermanentFailure whose reason names it and its cause."""

    @env.registry.handler("order", cooperative=cooperative)
    def order(req: HandlerRequest) -> Succeeded:
        if req.node_id == "plain":
            raise mayfly.NonRetryable("sku 42 is discontinued")
        if req.node_id == "long":
            raise mayfly.NonRetryable("x" * 10_000)
        try:
            {}["sku"]
        except KeyError as exc:
            raise Discontinued("sku 42") from exc
        return Succeeded()

    retry = RetryPolicy(max_attempts=3, backoff=ImmediateBackoff())
    result = env.runtime(clock=VirtualClock).execute(
        spec(*(Node(n, handler="order@1", retry=retry) for n in ("plain", "caused", "long")))
    )
    for summary in result.nodes.values():
        assert (summary.outcome, summary.attempts) == (mayfly.NodeOutcomeKind.PERMANENT_FAILURE, 1)
    assert result.nodes["plain"].reason == "handler raised NonRetryable: sku 42 is discontinued"
    assert result.nodes["caused"].reason == "handler raised Discontinued: sku 42 (from KeyError: 'sku')"
    assert result.nodes["long"].reason.startswith("handler raised NonRetryable: xxx")
    assert len(result.nodes["long"].reason.encode()) <= 4096


def test_a_permanent_failure_is_retried_when_the_policy_names_it(env: Env) -> None:
    """NonRetryable makes the outcome permanent; a policy that retries permanent failures still may."""

    @env.registry.handler("gone")
    def gone(req: HandlerRequest) -> Succeeded:
        raise mayfly.NonRetryable("gone")

    retry = RetryPolicy(
        max_attempts=2,
        retry_on=(mayfly.NodeOutcomeKind.PERMANENT_FAILURE,),
        backoff=ImmediateBackoff(),
    )
    result = env.runtime(clock=VirtualClock).execute(spec(Node("a", handler="gone@1", retry=retry)))
    assert result.nodes["a"].attempts == 2


@pytest.mark.parametrize("kinds", [(KeyboardInterrupt,), ("KeyError",), (KeyError, 3)])
def test_non_retryable_must_name_exception_classes(kinds: tuple[Any, ...]) -> None:
    """Registration refuses anything but Exception subclasses, so a typo cannot silently retry forever."""
    with pytest.raises(TypeError, match="non_retryable must list Exception subclasses"):
        HandlerRegistry().register("x", 1, lambda req: Succeeded(), non_retryable=kinds)


@pytest.mark.parametrize("cooperative", [False, True])
def test_exception_text_that_is_not_utf8_is_recorded_not_fatal(env: Env, cooperative: bool) -> None:
    """A lone surrogate in a handler's exception text becomes "?" in the reason instead of stopping the run."""

    @env.registry.handler("odd", cooperative=cooperative)
    def odd(req: HandlerRequest) -> Succeeded:
        raise ValueError("bad \ud800 text")

    result = env.runtime(clock=VirtualClock).execute(
        spec(Node("a", handler="odd@1", retry=RetryPolicy(max_attempts=1)))
    )
    assert result.nodes["a"].reason == "handler raised ValueError: bad ? text"


def test_a_spec_holding_a_default_in_an_object_of_its_own_replays_inspects_and_resumes(env: Env) -> None:
    """policy=json.loads('"all_succeeded"') equals the default, so the journal's copy verifies against it."""
    env.registry.register("ok", 1, lambda req: Succeeded())
    pinned = spec(
        Node("a", handler="ok@1", policy=json.loads('"all_succeeded"')),
        Node(
            "b", handler="ok@1", depends_on=["a"], retry=RetryPolicy(), policy=json.loads('"all_succeeded"')
        ),  # type: ignore[list-item]
    )
    result = env.runtime().execute(pinned)
    assert result.succeeded
    assert mayfly.recovery.replay_run(env.journal, result.run_id).state.spec_hash == pinned.content_hash()
    mayfly.recovery.inspect_run(env.journal, result.run_id)
    assert env.runtime().resume(result.run_id).succeeded


def test_returning_a_non_outcome_is_a_permanent_failure(env: Env) -> None:
    """A handler that returns something other than an outcome fails permanently with a clear reason."""
    env.registry.register("bad", 1, lambda req: {"ok": True})
    result = env.runtime().execute(spec(Node("a", handler="bad@1")))
    assert result.nodes["a"].outcome is mayfly.NodeOutcomeKind.PERMANENT_FAILURE
    assert "returned dict, expected an outcome" in result.nodes["a"].reason


def test_hour_long_backoffs_finish_in_well_under_a_second_on_the_virtual_clock(env: Env) -> None:
    """Two one-hour backoffs complete at virtual time 2h in milliseconds of wall time."""
    attempts: list[int] = []

    @env.registry.handler("flaky")
    def flaky(req: HandlerRequest) -> Any:
        attempts.append(req.attempt)
        return RetryableFailure(reason="not yet") if req.attempt < 3 else Succeeded(output=req.attempt)

    start = time.monotonic()
    result = env.runtime(clock=VirtualClock).execute(
        spec(Node("a", handler="flaky@1", retry=RetryPolicy(backoff=FixedBackoff(delay_ms=3_600_000))))
    )
    elapsed = time.monotonic() - start
    assert result.outputs == {"a": 3} and attempts == [1, 2, 3]
    assert elapsed < 1.0
    times = [e.at for e in env.events(result.run_id) if isinstance(e, NodeStarted)]
    assert times == [0, 3_600_000, 7_200_000]


def test_a_late_result_for_a_timed_out_attempt_is_rejected(env: Env) -> None:
    """A handler that outlives its attempt deadline: the timeout is committed, its late success is not."""
    release = threading.Event()

    @env.registry.handler("slow")
    def slow(req: HandlerRequest) -> Succeeded:
        release.wait(10)
        return Succeeded(output="late")

    @env.registry.handler("trigger", cooperative=True)
    def trigger(req: HandlerRequest) -> Succeeded:
        sleep(0.3)  # after the deadline of 'slow' (100 ms) passes, let the slow handler return
        release.set()
        sleep(0.2)
        return Succeeded()

    result = env.runtime().execute(
        spec(
            Node("slow", handler="slow@1", retry=RetryPolicy(max_attempts=1, attempt_deadline_ms=100)),
            Node("trigger", handler="trigger@1"),
        )
    )
    assert result.nodes["slow"].status is NodeStatus.FAILED
    assert "deadline" in result.nodes["slow"].reason
    outcomes = [
        e for e in env.events(result.run_id) if isinstance(e, NodeOutcomeCommitted) and e.node_id == "slow"
    ]
    assert len(outcomes) == 1 and outcomes[0].outcome.timeout  # type: ignore[union-attr]


def test_request_carries_attempt_identity_and_dependency_outcomes(env: Env) -> None:
    """Requests have one-based attempts, a stable idempotency key, cloned input and prerequisites."""
    requests: list[HandlerRequest] = []

    @env.registry.handler("first")
    def first(req: HandlerRequest) -> Succeeded:
        req.input["mutated"] = True  # a clone: durable input must not change
        return Succeeded(output={"n": 1})

    @env.registry.handler("second")
    def second(req: HandlerRequest) -> Succeeded:
        requests.append(req)
        return Succeeded()

    result = env.runtime().execute(
        spec(
            Node("a", handler="first@1", input={"k": "v"}), Node("b", handler="second@1", depends_on=("a",))
        ),
        input={"ticket": 7},
    )
    (req,) = requests
    assert req.attempt == 1 and req.run_input == {"ticket": 7}
    assert req.output_of("a") == {"n": 1}
    assert req.idempotency_key == mayfly.ids.idempotency_key(result.run_id, "b", req.attempt_id)
    created = env.events(result.run_id)[0]
    assert created.spec.nodes[0].input == {"k": "v"}


def test_missing_handlers_are_refused_before_anything_is_written(env: Env) -> None:
    """execute with an unregistered handler raises HandlerUnavailable and creates no run."""
    with pytest.raises(HandlerUnavailable, match="ghost@1"):
        env.runtime().execute(spec(Node("a", handler="ghost@1")))
    assert env.journal.list_runs() == []


def test_execute_in_current_task_runs_inside_an_existing_hub(env: Env) -> None:
    """Inside a hub task, ready handlers run serially in spec order without a second hub."""
    order: list[str] = []

    @env.registry.handler("step", cooperative=True)
    def step(req: HandlerRequest) -> Succeeded:
        order.append(f"start {req.node_id}")
        sleep(1)
        order.append(f"end {req.node_id}")
        return Succeeded()

    runtime = env.runtime()

    def coordinator() -> mayfly.RunResult:
        return runtime.execute_in_current_task(spec(Node("a", handler="step@1"), Node("b", handler="step@1")))

    result = Hub(VirtualClock()).run(coordinator)
    assert result.succeeded
    assert order == ["start a", "end a", "start b", "end b"]


def test_execute_in_current_task_rejects_attempt_deadlines(env: Env) -> None:
    """Attempt deadlines need the standalone runtime; the current-task mode refuses them up front."""
    env.registry.register("x", 1, lambda req: Succeeded())
    runtime = env.runtime()
    deadline_spec = spec(Node("a", handler="x@1", retry=RetryPolicy(attempt_deadline_ms=10)))
    with pytest.raises(UnsupportedInCurrentTask, match="nodes with deadlines: a"):
        Hub().run(runtime.execute_in_current_task, deadline_spec)
    with pytest.raises(HubNotRunning):
        runtime.execute_in_current_task(spec(Node("a", handler="x@1")))


def test_cancel_from_another_task_cancels_running_handlers(env: Env) -> None:
    """runtime.cancel (here from a parallel branch) records the cancellation; the running handler sees it."""
    observed: list[bool] = []
    runtime = env.runtime(clock=VirtualClock)

    @env.registry.handler("long", cooperative=True)
    def long(req: HandlerRequest) -> Any:
        try:
            sleep(3600)
        finally:
            observed.append(req.cancelled)
        return Succeeded()

    @env.registry.handler("stop", cooperative=True)
    def stop(req: HandlerRequest) -> Any:
        sleep(5)
        runtime.cancel(req.run_id, reason="operator", requester="alice")
        sleep(3600)
        return Succeeded()

    result = runtime.execute(
        spec(
            Node("a", handler="long@1"),
            Node("s", handler="stop@1"),
            Node("b", handler="long@1", depends_on=("a",)),
        )
    )
    assert result.status is RunStatus.CANCELLED
    assert {n: s.status for n, s in result.nodes.items()} == {
        "a": NodeStatus.CANCELLED,
        "s": NodeStatus.CANCELLED,
        "b": NodeStatus.CANCELLED,
    }
    assert observed == [True]


def test_cancel_in_current_task_mode_takes_effect_between_handlers(env: Env) -> None:
    """In current-task mode handlers run inline, so a cancellation is committed before the next one starts."""
    ran: list[str] = []

    @env.registry.handler("step", cooperative=True)
    def step(req: HandlerRequest) -> Succeeded:
        ran.append(req.node_id)
        sleep(60)
        return Succeeded()

    runtime = env.runtime()
    results: list[mayfly.RunResult] = []
    run_id = mayfly.ids.DeterministicIdSource(77).new_id()

    def main() -> None:
        chain = spec(Node("a", handler="step@1"), Node("b", handler="step@1", depends_on=("a",)))
        task = spawn(lambda: results.append(runtime.execute_in_current_task(chain, run_id=run_id)))
        sleep(5)
        runtime.cancel(run_id, reason="operator", requester="alice")
        task.join()

    Hub(VirtualClock()).run(main)
    assert results[0].status is RunStatus.CANCELLED
    assert ran == ["a"]
    assert results[0].nodes["b"].status is NodeStatus.CANCELLED


def _started_run(env: Env, ids: mayfly.ids.DeterministicIdSource) -> str:
    """A run whose node ``a`` (handler gone@1) was started by a process that then stopped; ``b`` is ready."""
    from mayfly.commit import commit_command
    from mayfly.model.commands import AttemptStart, CreateRun, StartNodes

    run_id = ids.new_id()
    state = commit_command(
        env.journal,
        None,
        CreateRun(run_id=run_id, spec=spec(Node("a", handler="gone@1"), Node("b", handler="here@1"))),
        ids=ids,
    ).state
    commit_command(env.journal, state, StartNodes((AttemptStart("a", ids.new_id()),)), ids=ids)
    return run_id


def test_resume_with_a_missing_handler_is_refused_and_the_same_resume_with_it_continues(env: Env) -> None:
    """ARCHITECTURE section 11: resume refuses, writing nothing and releasing its lease; it is never Blocked."""
    run_id = _started_run(env, mayfly.ids.DeterministicIdSource(8))
    before = env.journal.read(run_id)
    env.registry.register("here", 1, lambda req: Succeeded())
    seen: list[object] = []
    # A long lease: if the refusal kept it, the next resume would find it held.
    with pytest.raises(mayfly.errors.ResumeRefused) as refused:
        env.runtime(lease_ttl_ms=3_600_000).resume(run_id, on_recovery=lambda *plan: seen.append(plan))
    assert refused.value.missing == (("gone@1", ("a",)),)
    assert seen == [] and env.journal.read(run_id) == before
    env.registry.register("gone", 1, lambda req: Succeeded(output=req.attempt_id))
    result = WorkflowRuntime(env.journal, env.registry, leases=env.leases, owner="other").resume(run_id)
    assert result.status is RunStatus.SUCCEEDED
    started = [e for e in env.events(run_id) if isinstance(e, NodeStarted) and e.node_id == "a"]
    assert result.outputs["a"] == started[0].attempt_id and len(started) == 1  # reconciled, not restarted


def test_a_resumed_handler_that_returns_blocked_still_blocks_the_node(env: Env) -> None:
    """Blocked stays an outcome a handler may return: the resumed handler's Blocked is recorded."""
    run_id = _started_run(env, mayfly.ids.DeterministicIdSource(8))
    env.registry.register("here", 1, lambda req: Succeeded())
    env.registry.register("gone", 1, lambda req: mayfly.Blocked(reason="needs a human"))
    result = env.runtime().resume(run_id)
    assert result.status is RunStatus.BLOCKED
    assert result.nodes["a"].status is NodeStatus.BLOCKED and result.nodes["a"].reason == "needs a human"
    assert result.nodes["b"].status is NodeStatus.SUCCEEDED
