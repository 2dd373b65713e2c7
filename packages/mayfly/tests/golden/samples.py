"""One sample of every serialized form; the golden fixtures are their exact bytes.

When you add an event type, add a sample here, run the golden tests with
``MAYFLY_UPDATE_GOLDEN=1`` once to write its fixture, and commit the fixture.
Never regenerate an existing fixture to make a test pass: a changed fixture is
a changed durable format and needs a new schema version and an upcaster
(docs/compatibility.md).
"""

from __future__ import annotations

from mayfly.model.events import (
    AttemptDeadlineExpired,
    BudgetExhausted,
    BudgetKind,
    CancellationRequested,
    CancellationTarget,
    ChildCompleted,
    ChildStarted,
    EdgeActivated,
    Event,
    FailureCause,
    LastOutcome,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
    RunCreated,
    SignalAccepted,
    SignalExpired,
    SignalRejected,
    SignalWaitOpened,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import ArtifactRef, NodeOutcomeKind, RetryableFailure, Succeeded
from mayfly.model.signals import SignalRejection
from mayfly.model.spec import (
    ExponentialBackoff,
    FixedBackoff,
    Node,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)

RUN = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b"
ATTEMPT = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a60"
SIGNAL = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a62"
ARTIFACT = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a61"
CHILD_RUN = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a62"

SPEC = WorkflowSpec(
    workflow_id="acme.code-review",
    version=2,
    nodes=(
        Node("plan", handler="plan@1", input={"ticket": 42}, outputs=("plan",)),
        Node(
            "implement",
            handler="implement@3",
            depends_on=("plan",),
            retry=RetryPolicy(
                max_attempts=5,
                backoff=ExponentialBackoff(initial_ms=500, multiplier=3, maximum_ms=30_000),
                jitter_max_ms=250,
                attempt_deadline_ms=600_000,
            ),
            max_attempts=12,
        ),
        Node(
            "qa",
            handler="qa@1",
            depends_on=("implement",),
            policy="all_completed",
            retry=RetryPolicy(backoff=FixedBackoff(delay_ms=1000)),
        ),
    ),
    budgets=RunBudgets(max_attempts=100, max_transitions=1000, max_elapsed_ms=86_400_000),
    jitter_seed="golden",
)

OUTPUT = Succeeded(
    output={"diff_sha": "abc123", "files": 3},
    evidence=(ArtifactRef(ARTIFACT, 2048, "0" * 64, "text/x-diff"),),
)

SAMPLE_EVENTS: dict[str, Event] = {
    "RunCreated": RunCreated(run_id=RUN, spec=SPEC, spec_hash=SPEC.content_hash(), input={"ticket": 42}),
    "NodeReady": NodeReady(node_id="plan", cause="initial"),
    "NodeStarted": NodeStarted(node_id="implement", attempt_id=ATTEMPT, attempt=2, at=1500, deadline=601_500),
    "NodeOutcomeCommitted": NodeOutcomeCommitted(
        node_id="implement", outcome=OUTPUT, attempt_id=ATTEMPT, at=9000
    ),
    "NodeFailed": NodeFailed(
        node_id="qa", cause=FailureCause.RETRIES_EXHAUSTED, detail="3 of 3 attempts used"
    ),
    "RetryScheduled": RetryScheduled(node_id="qa", next_attempt=2, delay_ms=1000, deadline=10_000),
    "RetryReleased": RetryReleased(node_id="qa", next_attempt=2, at=10_000),
    "VirtualTimeAdvanced": VirtualTimeAdvanced(to=10_000),
    "AttemptDeadlineExpired": AttemptDeadlineExpired(
        node_id="implement", attempt_id=ATTEMPT, deadline=601_500
    ),
    "BudgetExhausted": BudgetExhausted(
        kind=BudgetKind.NODE_ATTEMPTS,
        limit=12,
        observed=13,
        node_id="implement",
        last_outcome=LastOutcome("implement", NodeOutcomeKind.RETRYABLE_FAILURE, ATTEMPT),
    ),
    "CancellationRequested": CancellationRequested(
        requester="alice@example.com",
        reason="superseded by ticket 43",
        at=12_000,
        targets=(CancellationTarget("implement", ATTEMPT),),
    ),
    "RunCompleted": RunCompleted(result="cancelled", at=12_000),
    "EdgeActivated": EdgeActivated(edge=1, source="qa", target="implement", source_sequence=41),
    "ChildStarted": ChildStarted(
        node_id="implement",
        attempt_id=ATTEMPT,
        attempt=1,
        child_run_id=CHILD_RUN,
        workflow_id="acme.lint",
        version=3,
        input={"ticket": 42},
        at=1500,
        deadline=601_500,
    ),
    "ChildCompleted": ChildCompleted(
        node_id="implement",
        attempt_id=ATTEMPT,
        child_run_id=CHILD_RUN,
        result="succeeded",
        output={"warnings": 0},
        at=9000,
    ),
    "SignalWaitOpened": SignalWaitOpened(
        node_id="approval",
        attempt_id=ATTEMPT,
        name="approval",
        token_sha256="sha256:" + "5" * 64,
        at=20_000,
        deadline=86_420_000,
    ),
    "SignalAccepted": SignalAccepted(
        signal_id=SIGNAL,
        node_id="approval",
        attempt_id=ATTEMPT,
        name="approval",
        at=30_000,
        decision={"verdict": "approve", "by": "alice"},
    ),
    "SignalRejected": SignalRejected(
        signal_id=SIGNAL, node_id="approval", reason=SignalRejection.TOKEN_MISMATCH, at=25_000
    ),
    "SignalExpired": SignalExpired(
        node_id="approval", attempt_id=ATTEMPT, name="approval", deadline=86_420_000
    ),
}

RETRYABLE = RetryableFailure(reason="flaky test", timeout=False)
