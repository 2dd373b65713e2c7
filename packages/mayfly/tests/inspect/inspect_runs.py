"""Real runs for the inspection and telemetry tests, with canary strings in every payload.

(A helper module, not a conftest: the core tests import the root conftest by name.)

Inputs and outputs carry canaries that must never appear in any inspection,
PAL, metric or log output; reasons carry canaries that must appear (bounded
reasons are the operator-safe diagnostic channel).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from mayfly import (
    Blocked,
    Cancelled,
    ChangesRequested,
    Edge,
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    ImmediateBackoff,
    Node,
    NodeOutcome,
    NodeOutcomeKind,
    OnOutcome,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    Skipped,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.commit import seal_events
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.signals import SignalToken
from mayfly.recovery import RecoveredRun, inspect_run
from mayfly.runtime import WaitForSignal
from mayfly.substrate import VirtualClock
from mayfly.testing import ReducerHarness

RUN_INPUT_CANARY = "CANARY-RUN-INPUT-7f3a"
NODE_INPUT_CANARY = "CANARY-NODE-INPUT-91c2"
OUTPUT_CANARY = "CANARY-OUTPUT-5d0e"
TOKEN_CANARY = "CANARY-TOKEN-a8b4"
SIGNAL_TOKEN = "CANARY-SIGNAL-TOKEN-3f9d0c"
DECISION_CANARY = "CANARY-DECISION-6e21"
REVIEW_REASON = "needs tests REASON-REVIEW-44"
QA_REASON = "flaky runner REASON-QA-12"

PAYLOAD_CANARIES = (
    RUN_INPUT_CANARY,
    NODE_INPUT_CANARY,
    OUTPUT_CANARY,
    TOKEN_CANARY,
    SIGNAL_TOKEN,
    DECISION_CANARY,
)
"""Strings from run input, node input, handler output, signal tokens and decisions: never in any output."""


def review_spec() -> WorkflowSpec:
    """The demo's shape: plan -> implement -> review (loops back once) -> qa (retried once) -> publish.

    ``review`` has no ``depends_on``: the edge from ``implement`` starts each of its activations.
    """
    return WorkflowSpec(
        workflow_id="demo.review",
        version=1,
        nodes=(
            Node("plan", handler="plan@1", input={"brief": NODE_INPUT_CANARY, "token": TOKEN_CANARY}),
            Node("implement", handler="implement@1", depends_on=("plan",)),
            Node("review", handler="review@1"),
            Node(
                "qa",
                handler="qa@1",
                depends_on=("review",),
                retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=1_500)),
            ),
            Node("publish", handler="publish@1", depends_on=("qa",)),
        ),
        edges=(
            Edge("implement", "review", when=OnOutcome(NodeOutcomeKind.SUCCEEDED)),
            Edge("review", "implement", when=OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)),
        ),
        initial=("plan",),
    )


def review_registry() -> HandlerRegistry:
    """Handlers whose outputs carry the output canary; review and qa fail once each."""
    registry = HandlerRegistry()
    calls: dict[str, int] = {}

    def count(req: HandlerRequest) -> int:
        calls[req.node_id] = calls.get(req.node_id, 0) + 1
        return calls[req.node_id]

    @registry.handler("plan")
    def plan(req: HandlerRequest) -> NodeOutcome:
        count(req)
        return Succeeded(output={"plan": OUTPUT_CANARY, "echo": req.input})

    @registry.handler("implement")
    def implement(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"diff": f"{OUTPUT_CANARY}-{count(req)}", "run": req.run_input})

    @registry.handler("review")
    def review(req: HandlerRequest) -> NodeOutcome:
        if count(req) == 1:
            return ChangesRequested(reason=REVIEW_REASON)
        return Succeeded(output={"verdict": OUTPUT_CANARY})

    @registry.handler("qa")
    def qa(req: HandlerRequest) -> NodeOutcome:
        if count(req) == 1:
            return RetryableFailure(reason=QA_REASON)
        return Succeeded(output=OUTPUT_CANARY)

    @registry.handler("publish")
    def publish(req: HandlerRequest) -> NodeOutcome:
        count(req)
        return Succeeded(output={"url": OUTPUT_CANARY})

    return registry


@dataclass
class Completed:
    """A run driven to its end by the real runtime on the local journal."""

    journal: LocalWorkflowJournal
    run_id: str
    spec: WorkflowSpec

    def recovered(self) -> RecoveredRun:
        """The run as ``inspect_run`` reconstructs it."""
        return inspect_run(self.journal, self.run_id)

    def records(self) -> list[JournalRecord]:
        """Every record of the run, in order."""
        return self.journal.read(self.run_id)


def journal_at(root: Path) -> LocalWorkflowJournal:
    """A local journal under ``root``."""
    return LocalWorkflowJournal(f"file://{root}/journal?durability=write")


def run_review(tmp_path: Path, namespace: int = 3, *, snapshot_every: int = 1_000) -> Completed:
    """The review workflow run to success by WorkflowRuntime on virtual time (ids from ``namespace``).

    Its history is short, so it ends without a snapshot unless ``snapshot_every`` asks for one.
    """
    journal = journal_at(tmp_path)
    leases = LocalLeaseStore(journal.url)
    runtime = WorkflowRuntime(
        journal,
        review_registry(),
        leases=leases,
        clock=VirtualClock,
        ids=DeterministicIdSource(namespace=namespace),
        snapshot_every=snapshot_every,
    )
    spec = review_spec()
    result = runtime.execute(spec, input={"ticket": RUN_INPUT_CANARY})
    assert result.succeeded
    return Completed(journal, result.run_id, spec)


def approval_spec() -> WorkflowSpec:
    """draft -> approval (a durable signal wait with a one-minute deadline) -> publish."""
    return WorkflowSpec(
        workflow_id="demo.approval",
        version=1,
        nodes=(
            Node("draft", handler="draft@1", input={"secret": NODE_INPUT_CANARY}),
            Node("approval", handler="approval@1", depends_on=("draft",)),
            Node("publish", handler="publish@1", depends_on=("approval",)),
        ),
    )


def approval_registry() -> HandlerRegistry:
    """``approval`` waits for signal ``approval`` and then outputs the decision it received."""
    registry = HandlerRegistry()

    @registry.handler("draft")
    def draft(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"text": OUTPUT_CANARY})

    @registry.handler("approval")
    def approval(req: HandlerRequest) -> NodeOutcome | WaitForSignal:
        if req.signal is None:
            return WaitForSignal("approval", SignalToken(SIGNAL_TOKEN), timeout_ms=60_000)
        return Succeeded(output={"decision": req.signal.decision})

    @registry.handler("publish")
    def publish(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"url": OUTPUT_CANARY})

    return registry


@dataclass
class Approval(Completed):
    """A run parked on its approval signal, and the runtime that can signal and resume it."""

    runtime: WorkflowRuntime


def run_until_approval(tmp_path: Path) -> Approval:
    """Run the approval workflow until it parks on its signal wait."""
    journal = journal_at(tmp_path)
    runtime = WorkflowRuntime(
        journal,
        approval_registry(),
        leases=LocalLeaseStore(journal.url),
        clock=VirtualClock,
        ids=DeterministicIdSource(namespace=6),
    )
    result = runtime.execute(approval_spec(), input={"ticket": RUN_INPUT_CANARY})
    assert result.waiting == {"approval": "approval"}
    return Approval(journal, result.run_id, approval_spec(), runtime)


def persist(harness: ReducerHarness, root: Path) -> Completed:
    """Write a harness's history to a local journal as sealed records, as the runtime would."""
    journal = journal_at(root)
    records = seal_events(harness.run_id, 1, harness.history, DeterministicIdSource(namespace=11))
    journal.append(harness.run_id, 1, records)
    return Completed(journal, harness.run_id, harness.state.spec)


def scripted_spec() -> WorkflowSpec:
    """A diamond (a -> b, c -> d) with immediate retries, for property tests."""
    retry = RetryPolicy(max_attempts=3, backoff=ImmediateBackoff())
    return WorkflowSpec(
        workflow_id="prop.diamond",
        version=1,
        nodes=(
            Node("a", handler="a@1", input={"k": NODE_INPUT_CANARY}, retry=retry),
            Node("b", handler="b@1", depends_on=("a",), retry=retry),
            Node("c", handler="c@1", depends_on=("a",), policy="all_completed", retry=retry),
            Node("d", handler="d@1", depends_on=("b", "c"), policy="any_succeeded", retry=retry),
        ),
    )


OUTCOME_CHOICES: tuple[NodeOutcome, ...] = (
    Succeeded(output={"x": OUTPUT_CANARY}),
    RetryableFailure(reason="transient REASON-PROP-1"),
    PermanentFailure(reason="broken REASON-PROP-2"),
    ChangesRequested(reason="rework REASON-PROP-3"),
    Blocked(reason="no access REASON-PROP-4"),
    Cancelled(reason="gave up REASON-PROP-5"),
    Skipped(reason="not needed REASON-PROP-6"),
)
"""Every outcome kind, with payload canaries in the output and reasons that may be shown."""

SCRIPTS = st.fixed_dictionaries(
    {node: st.lists(st.integers(0, len(OUTCOME_CHOICES) - 1), min_size=3, max_size=3) for node in "abcd"}
)
"""Outcome scripts for :func:`scripted_run`: three picks per node (enough for three attempts)."""


def scripted_run(script: dict[str, list[int]]) -> tuple[RecoveredRun, list[JournalRecord]]:
    """Drive :func:`scripted_spec` with outcomes picked by index; return the run as recovery sees it."""
    harness = ReducerHarness(scripted_spec(), input={"ticket": RUN_INPUT_CANARY})
    outcomes = {node: [OUTCOME_CHOICES[i] for i in picks] for node, picks in script.items()}
    harness.run_script(outcomes)
    records = seal_events(harness.run_id, 1, harness.history, DeterministicIdSource(namespace=12))
    return RecoveredRun(harness.state, "journal", len(records), records[-1], ()), records
