"""Retry policy, deterministic backoff and jitter, and virtual time (ADR-0032 Story 1.5)."""

from __future__ import annotations

import pytest
from conftest import node, workflow

from mayfly.model.commands import AdvanceTime, CompleteAttempt, RejectionCode
from mayfly.model.events import (
    AttemptDeadlineExpired,
    FailureCause,
    NodeFailed,
    NodeOutcomeCommitted,
    RetryReleased,
    RetryScheduled,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import NodeOutcomeKind, PermanentFailure, RetryableFailure, Succeeded
from mayfly.model.spec import ExponentialBackoff, FixedBackoff, ImmediateBackoff, RetryPolicy
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.reducer import backoff_delay, fnv1a_64, jitter
from mayfly.testing import ReducerHarness

FLAKY = RetryableFailure(reason="flaky")


# Published FNV-1a 64-bit test vectors (Fowler/Noll/Vo reference suite).
@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)],
)
def test_fnv1a_64_reference_vectors(data: bytes, expected: int) -> None:
    """The hash matches the published FNV-1a 64-bit vectors."""
    assert fnv1a_64(data) == expected


# Jitter vectors, computed once by an independent implementation and pinned (also in docs).
@pytest.mark.parametrize(
    ("seed", "run_id", "node_id", "attempt", "maximum", "expected"),
    [
        ("seed-1", "00000000-0000-7000-8000-000000000001", "qa", 2, 1000, 911),
        ("seed-1", "00000000-0000-7000-8000-000000000001", "qa", 3, 1000, 915),
        ("", "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b", "review", 2, 250, 51),
        ("pinned", "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b", "implement", 5, 60000, 13209),
        ("pinned", "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b", "implement", 5, 0, 0),
    ],
)
def test_jitter_vectors(
    seed: str, run_id: str, node_id: str, attempt: int, maximum: int, expected: int
) -> None:
    """Jitter is FNV-1a-64 over seed, run, node and attempt joined by 0x1F, mod maximum + 1."""
    assert jitter(seed, run_id, node_id, attempt, maximum) == expected


@pytest.mark.parametrize(
    ("backoff", "delays"),
    [
        (ImmediateBackoff(), [0, 0, 0]),
        (FixedBackoff(delay_ms=250), [250, 250, 250]),
        # min(initial * multiplier^(next_attempt - 2), maximum), attempts 2..8
        (ExponentialBackoff(), [1000, 2000, 4000, 8000, 16000, 32000, 60000]),
        (ExponentialBackoff(initial_ms=100, multiplier=3, maximum_ms=1000), [100, 300, 900, 1000, 1000]),
    ],
)
def test_backoff_schedules(backoff: object, delays: list[int]) -> None:
    """Each schedule yields the ADR's delay for attempts 2, 3, 4, ..."""
    policy = RetryPolicy(backoff=backoff)  # type: ignore[arg-type]
    assert [backoff_delay(policy, attempt) for attempt in range(2, 2 + len(delays))] == delays


def test_huge_attempt_numbers_stay_cheap_and_capped() -> None:
    """Exponential backoff for attempt 10**6 is the maximum, computed without huge integers."""
    assert backoff_delay(RetryPolicy(), 10**6) == 60_000


def test_retry_schedules_an_absolute_deadline_and_releases_at_it() -> None:
    """RetryScheduled stores now + delay; RetryReleased happens only once time reaches it."""
    run = ReducerHarness(workflow(node("a", retry=RetryPolicy(backoff=FixedBackoff(delay_ms=500)))))
    run.start("a")
    run.advance(100)
    run.complete("a", FLAKY)
    assert run.history[-1] == RetryScheduled(node_id="a", next_attempt=2, delay_ms=500, deadline=600)
    assert run.state.node_by_id("a").status is NodeStatus.RETRY_PENDING  # type: ignore[union-attr]
    assert run.advance(599) == [VirtualTimeAdvanced(to=599)]
    assert run.advance(600) == [
        VirtualTimeAdvanced(to=600),
        RetryReleased(node_id="a", next_attempt=2, at=600),
    ]
    attempt = run.start("a")["a"]
    assert run.state.node_by_id("a").attempt == 2  # type: ignore[union-attr]
    run.complete("a", Succeeded(), attempt)
    assert run.state.status is RunStatus.SUCCEEDED


def test_immediate_retry_records_schedule_and_release_at_the_same_time() -> None:
    """An immediate retry still emits both RetryScheduled and RetryReleased at the current time."""
    run = ReducerHarness(workflow(node("a", retry=RetryPolicy(backoff=ImmediateBackoff()))))
    run.start("a")
    run.advance(42)
    events = run.complete("a", FLAKY)
    assert events[1:] == [
        RetryScheduled(node_id="a", next_attempt=2, delay_ms=0, deadline=42),
        RetryReleased(node_id="a", next_attempt=2, at=42),
    ]
    assert run.state.ready_nodes() == ["a"]


def test_jitter_is_added_to_the_stored_deadline() -> None:
    """With jitter the deadline is now + backoff + the FNV-1a jitter of the pinned seed."""
    spec = workflow(
        node("qa", retry=RetryPolicy(backoff=FixedBackoff(delay_ms=1000), jitter_max_ms=1000)),
        jitter_seed="seed-1",
    )
    run = ReducerHarness(spec)
    assert run.run_id == "00000000-0000-7000-8000-000000000001"
    run.start("qa")
    run.complete("qa", FLAKY)
    assert run.history[-1] == RetryScheduled(node_id="qa", next_attempt=2, delay_ms=1911, deadline=1911)


def test_retries_stop_at_max_attempts_with_an_explicit_failure_fact() -> None:
    """The third retryable failure under the default policy fails the node, retaining the outcome."""
    run = ReducerHarness(workflow(node("a", retry=RetryPolicy(backoff=ImmediateBackoff()))))
    for _ in range(3):
        run.start("a")
        run.complete("a", FLAKY)
    assert run.history[-2] == NodeFailed(
        node_id="a", cause=FailureCause.RETRIES_EXHAUSTED, detail="3 of 3 attempts used"
    )
    a = run.state.node_by_id("a")
    assert a is not None and a.status is NodeStatus.FAILED and a.last_outcome == FLAKY
    assert run.state.status is RunStatus.FAILED


def test_permanent_failure_is_not_retried_by_default() -> None:
    """PermanentFailure ends the node at once under the default policy."""
    run = ReducerHarness(workflow(node("a")))
    run.start("a")
    run.complete("a", PermanentFailure(reason="bad input"))
    assert run.types()[-2:] == ["NodeOutcomeCommitted", "RunCompleted"]


def test_permanent_failure_is_retried_only_when_named() -> None:
    """Naming permanent_failure in retry_on makes it retryable."""
    policy = RetryPolicy(retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,), backoff=FixedBackoff(delay_ms=10))
    run = ReducerHarness(workflow(node("a", retry=policy)))
    run.start("a")
    run.complete("a", PermanentFailure(reason="maybe not"))
    assert run.history[-1] == RetryScheduled(node_id="a", next_attempt=2, delay_ms=10, deadline=10)


def test_retryable_failure_not_in_retry_on_fails_explicitly() -> None:
    """A policy that names only permanent_failure fails a retryable outcome with NOT_RETRYABLE."""
    run = ReducerHarness(
        workflow(node("a", retry=RetryPolicy(retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,))))
    )
    run.start("a")
    run.complete("a", FLAKY)
    assert isinstance(run.history[-2], NodeFailed)
    assert run.history[-2].cause is FailureCause.NOT_RETRYABLE  # type: ignore[union-attr]


def test_time_is_monotonic() -> None:
    """AdvanceTime to the current time is a no-op; to an earlier time it is a typed rejection."""
    run = ReducerHarness(workflow(node("a")))
    run.advance(10)
    assert run.advance(10) == []
    result = run.try_execute(AdvanceTime(9))
    assert getattr(result, "code", None) is RejectionCode.TIME_WENT_BACKWARDS


def test_attempt_deadline_expiry_is_a_retryable_timeout() -> None:
    """At the deadline: VirtualTimeAdvanced, AttemptDeadlineExpired, a timeout outcome, a retry."""
    policy = RetryPolicy(attempt_deadline_ms=1000, backoff=FixedBackoff(delay_ms=5))
    run = ReducerHarness(workflow(node("a", retry=policy)))
    attempt = run.start("a")["a"]
    assert run.state.node_by_id("a").attempt_deadline == 1000  # type: ignore[union-attr]
    assert run.advance(999) == [VirtualTimeAdvanced(to=999)]
    events = run.advance(1000)
    timeout = RetryableFailure(reason="attempt deadline 1000 ms expired", timeout=True)
    assert events == [
        VirtualTimeAdvanced(to=1000),
        AttemptDeadlineExpired(node_id="a", attempt_id=attempt, deadline=1000),
        NodeOutcomeCommitted(node_id="a", outcome=timeout, attempt_id=attempt, at=1000),
        RetryScheduled(node_id="a", next_attempt=2, delay_ms=5, deadline=1005),
    ]
    late = run.try_execute(CompleteAttempt("a", attempt, Succeeded()))
    assert getattr(late, "code", None) is RejectionCode.ATTEMPT_NOT_ACTIVE


def test_attempt_deadline_expiry_on_the_last_attempt_is_terminal() -> None:
    """A timeout with no attempts left fails the node and the run."""
    policy = RetryPolicy(max_attempts=1, attempt_deadline_ms=50)
    run = ReducerHarness(workflow(node("a", retry=policy)))
    run.start("a")
    run.advance(60)
    assert run.types()[-3:] == ["NodeOutcomeCommitted", "NodeFailed", "RunCompleted"]
    assert run.state.status is RunStatus.FAILED


def test_hour_long_backoffs_complete_instantly_in_virtual_time() -> None:
    """A scripted run with one-hour fixed backoffs finishes at virtual time 2h."""
    policy = RetryPolicy(backoff=FixedBackoff(delay_ms=3_600_000))
    run = ReducerHarness(workflow(node("a", retry=policy)))
    run.run_script({"a": [FLAKY, FLAKY, Succeeded()]})
    assert run.state.status is RunStatus.SUCCEEDED
    assert run.state.now == 7_200_000
