"""WorkflowTestEnv: virtual time that moves when told, signals at chosen times, crashes and history checks."""

from __future__ import annotations

from typing import Any

import pytest

from mayfly import (
    ChildCall,
    ChildDefinition,
    Edge,
    FixedBackoff,
    HandlerRegistry,
    Node,
    NodeOutcomeKind,
    OnOutcome,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WaitForSignal,
    WorkflowSpec,
)
from mayfly.errors import CommandRejected
from mayfly.model.events import (
    AttemptDeadlineExpired,
    NodeStarted,
    RetryScheduled,
    RunCompleted,
    SignalAccepted,
    SignalExpired,
    VirtualTimeAdvanced,
)
from mayfly.model.signals import SignalToken
from mayfly.testing import WorkflowTestEnv, assert_events

DAY = 86_400_000
HOUR = 3_600_000
TOKEN = SignalToken("approval-token-for-tests")


def _approval_registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register("order", 1, lambda req: Succeeded(output={"order": 7}))

    @registry.handler("approve", cooperative=True)
    def approve(req: Any) -> Any:
        if req.signal is None:
            return WaitForSignal("approval", TOKEN, timeout_ms=3 * DAY)
        return Succeeded(output={"by": req.signal.decision["by"]})

    registry.register("ship", 1, lambda req: Succeeded(output={"ship": True}))
    registry.register("refund", 1, lambda req: Succeeded(output={"refund": True}))
    return registry


APPROVAL = WorkflowSpec(
    "orders",
    1,
    (
        Node("order", handler="order@1"),
        Node("approve", handler="approve@1", depends_on=("order",), retry=RetryPolicy(max_attempts=1)),
        Node("ship", handler="ship@1", depends_on=("approve",)),
        Node("refund", handler="refund@1"),
    ),
    edges=(Edge("approve", "refund", OnOutcome(NodeOutcomeKind.RETRYABLE_FAILURE)),),
)


def test_an_approval_after_two_days_ships() -> None:
    """A signal delivered at day 2 of a 3-day wait is accepted at day 2 and the run ships."""
    with WorkflowTestEnv(_approval_registry()) as env:
        run = env.start(APPROVAL, {"item": 1})
        assert env.result(run).waiting == {"approve": "approval"} and env.now_ms == 0
        env.advance(days=2)
        assert env.now_ms == 2 * DAY and env.result(run).status is RunStatus.RUNNING
        disposition = env.signal(run, "approve", token=TOKEN, decision={"by": "alice"})
        assert disposition.status == "accepted"
        result = env.result(run)
        assert result.succeeded and result.outputs["ship"] == {"ship": True}
        assert result.nodes["refund"].outcome is NodeOutcomeKind.SKIPPED
        env.assert_events(
            run,
            [
                (VirtualTimeAdvanced, {"to": 2 * DAY}),
                (SignalAccepted, {"node_id": "approve", "at": 2 * DAY}),
                (NodeStarted, {"node_id": "ship", "at": 2 * DAY}),
                (RunCompleted, {"result": "succeeded"}),
            ],
        )


def test_after_four_days_the_wait_expired_at_three_and_the_compensation_ran() -> None:
    """Advancing 4 days fires the wait's deadline at day 3 exactly; the refund runs then; a late signal is refused."""
    with WorkflowTestEnv(_approval_registry()) as env:
        run = env.start(APPROVAL)
        env.advance(days=4)
        assert env.now_ms == 4 * DAY
        result = env.result(run)
        assert result.status is RunStatus.FAILED and "ship" not in result.outputs
        assert result.outputs["refund"] == {"refund": True}
        env.assert_events(
            run,
            [
                (SignalExpired, {"node_id": "approve", "deadline": 3 * DAY}),
                (NodeStarted, {"node_id": "refund", "at": 3 * DAY}),
                (RunCompleted, {"result": "failed", "at": 3 * DAY}),
            ],
        )
        with pytest.raises(CommandRejected, match="run_terminal"):
            env.signal(run, "approve", token=TOKEN, decision={"by": "alice"})


def test_backoffs_fire_at_once_at_their_virtual_times() -> None:
    """Two one-hour backoffs take no wall time: the attempts start at 0, 1 h and 2 h of virtual time."""
    registry = HandlerRegistry()
    starts: list[int] = []

    @registry.handler("flaky", version=1)
    def flaky(req: Any) -> Any:
        starts.append(req.attempt)
        return RetryableFailure(reason="down") if req.attempt < 3 else Succeeded(output={"ok": True})

    spec = WorkflowSpec(
        "retry",
        1,
        (Node("flaky", handler="flaky@1", retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(HOUR))),),
    )
    with WorkflowTestEnv(registry) as env:
        run = env.start(spec)
        assert env.result(run).succeeded and starts == [1, 2, 3]
        assert env.now_ms == 2 * HOUR
        at = [event.at for event in env.history(run) if isinstance(event, NodeStarted)]
        assert at == [0, HOUR, 2 * HOUR]


def test_an_attempt_deadline_fires_in_virtual_time() -> None:
    """A handler sleeping past its attempt deadline is timed out at the deadline, without waiting for it."""
    from mayfly.substrate import sleep

    registry = HandlerRegistry()

    @registry.handler("slow", cooperative=True)
    def slow(req: Any) -> Any:
        if req.attempt == 1:
            sleep(3_600)  # an hour of virtual time, on the hub
        return Succeeded(output={"attempt": req.attempt})

    spec = WorkflowSpec(
        "deadline",
        1,
        (Node("slow", handler="slow@1", retry=RetryPolicy(max_attempts=2, attempt_deadline_ms=60_000)),),
    )
    with WorkflowTestEnv(registry) as env:
        run = env.start(spec)
        result = env.result(run)
        assert result.succeeded and result.outputs["slow"] == {"attempt": 2}
        assert env.now_ms == 61_000, "the deadline at 60 s, then the 1 s backoff; never the hour of sleep"
        env.assert_events(
            run,
            [
                (AttemptDeadlineExpired, {"node_id": "slow", "deadline": 60_000}),
                (RetryScheduled, {"next_attempt": 2, "deadline": 61_000}),
                (NodeStarted, {"attempt": 2, "at": 61_000}),
            ],
        )


def test_a_crash_after_an_event_stops_the_drive_and_a_new_runtime_recovers_the_attempt() -> None:
    """crash_after stops the drive right after the commit; the next drive re-invokes the same attempt id."""
    registry = HandlerRegistry()
    calls: list[tuple[str, int]] = []

    @registry.handler("charge", version=1)
    def charge(req: Any) -> Any:
        calls.append((req.attempt_id, req.attempt))
        return Succeeded(output={"key": req.idempotency_key})

    spec = WorkflowSpec("pay", 1, (Node("charge", handler="charge@1"),))
    with WorkflowTestEnv(registry) as env:
        first_owner = env.runtime.owner
        env.crash_after(NodeStarted, node="charge")
        run = env.start(spec)
        assert env.crashes == [run] and calls == []
        assert env.event_types(run)[-1] == "NodeStarted" and env.result(run).status is RunStatus.RUNNING
        assert env.runtime.owner != first_owner, "the crashed runtime was dropped"
        started = [e for e in env.history(run) if isinstance(e, NodeStarted)]
        assert env.run_until_parked() is True
        assert env.result(run).succeeded
        assert calls == [(started[0].attempt_id, 1)], "the in-flight attempt was re-invoked under its id"


def test_assert_events_reports_the_missing_event_and_the_history() -> None:
    """assert_events matches in order by class or name and fields, and says what it did not find."""
    with WorkflowTestEnv(_approval_registry()) as env:
        run = env.start(APPROVAL)
        history = env.history(run)
        assert_events(history, ["RunCreated", NodeStarted, ("SignalWaitOpened", {"deadline": 3 * DAY})])
        assert_events(history, [type(event) for event in history], exact=True)
        with pytest.raises(AssertionError, match=r"expected event 1 \(RunCompleted\) not found in order"):
            assert_events(history, ["RunCreated", "RunCompleted"])
        with pytest.raises(AssertionError, match="expected exactly"):
            assert_events(history, ["RunCreated"], exact=True)


def test_time_never_goes_back_and_run_ids_repeat() -> None:
    """advance refuses to move backwards; a fresh env hands out the same run ids (deterministic ids)."""
    ids = []
    for _ in range(2):
        with WorkflowTestEnv(_approval_registry()) as env:
            ids.append(env.start(APPROVAL))
            env.advance(hours=1)
            with pytest.raises(ValueError, match="forward"):
                env.advance_to(0)
            with pytest.raises(ValueError, match="forward"):
                env.advance(-1)
    assert ids[0] == ids[1]


REVIEW = ChildDefinition(
    workflow_id="review",
    version=1,
    nodes=(Node("scan", handler="scan@1", outputs=("ok",), retry=RetryPolicy(max_attempts=1)),),
    outputs=("ok",),
)
PARENT = WorkflowSpec(
    "parent",
    1,
    (
        Node("review", child=ChildCall("review", 1, "require_success", (), ("ok",))),
        Node("report", handler="report@1", depends_on=("review",)),
    ),
    catalog=(REVIEW,),
)


def _child_registry() -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.handler("scan", cooperative=True)
    def scan(req: Any) -> Any:
        if req.signal is None:
            return WaitForSignal("approval", TOKEN, timeout_ms=DAY)
        return Succeeded(output={"ok": req.signal.decision["ok"]})

    registry.register("report", 1, lambda req: Succeeded(output={"done": True}))
    return registry


def test_a_signal_to_a_parked_child_run_wakes_and_finishes_its_parent() -> None:
    """A parent parked on its child's wait is woken by a signal to the child and both finish."""
    with WorkflowTestEnv(_child_registry()) as env:
        run = env.start(PARENT)
        child = env.result(run).nodes["review"].child_run_id
        assert child is not None and env.result(child).waiting == {"scan": "approval"}
        env.advance(hours=12)
        assert env.signal(child, "scan", token=TOKEN, decision={"ok": True}).status == "accepted"
        result = env.result(run)
        assert result.succeeded and result.outputs["report"] == {"done": True}
        assert env.now_ms == 12 * HOUR


def test_a_child_runs_wait_deadline_wakes_its_parked_parent_at_that_time() -> None:
    """Advancing past a child's signal deadline drives the parent at the deadline: the child expires."""
    with WorkflowTestEnv(_child_registry()) as env:
        run = env.start(PARENT)
        env.advance(days=2)
        result = env.result(run)
        assert (
            result.status is RunStatus.FAILED
            and result.nodes["review"].outcome is NodeOutcomeKind.PERMANENT_FAILURE
        )
        child = result.nodes["review"].child_run_id
        assert child is not None
        env.assert_events(
            child, [(SignalExpired, {"deadline": DAY}), (RunCompleted, {"result": "failed", "at": DAY})]
        )


def test_runs_falling_due_in_one_step_are_driven_in_wake_order() -> None:
    """Three runs whose waits expire at days 3, 1 and 2 are driven at those times, earliest first."""
    order: list[tuple[str, int]] = []
    registry = HandlerRegistry()

    @registry.handler("wait", cooperative=True)
    def wait(req: Any) -> Any:
        return WaitForSignal("go", TOKEN, timeout_ms=req.run_input["days"] * DAY)

    @registry.handler("after", version=1)
    def after(req: Any) -> Any:
        order.append((req.run_input["name"], env.now_ms // DAY))
        return Succeeded()

    spec = WorkflowSpec(
        "expiring",
        1,
        (
            Node("wait", handler="wait@1", retry=RetryPolicy(max_attempts=1)),
            Node("after", handler="after@1"),
        ),
        edges=(Edge("wait", "after", OnOutcome(NodeOutcomeKind.RETRYABLE_FAILURE)),),
    )
    with WorkflowTestEnv(registry) as env:
        for name, days in (("c", 3), ("a", 1), ("b", 2)):
            env.start(spec, {"name": name, "days": days})
        env.advance(days=5)
    assert order == [("a", 1), ("b", 2), ("c", 3)]
