"""The demo workflow: a code-review pipeline that exercises every durable feature once.

plan → implement → review ⇄ implement (the first review requests changes) →
qa (the first attempt fails transiently and is retried with backoff) →
approval (a durable signal wait) → publish.

This module is an ordinary handlers module, not a plugin: its handlers are in
no registry unless asked for. ``mayfly demo`` registers them itself, and a
demo run is continued in a fresh process like any other run, by naming the
module: ``mayfly resume RUN --handlers mayfly.demo`` (:func:`register`).
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from mayfly.model.outcomes import ChangesRequested, NodeOutcome, PermanentFailure, RetryableFailure, Succeeded
from mayfly.model.outcomes import NodeOutcomeKind as Kind
from mayfly.model.spec import Edge, ExponentialBackoff, Node, OnOutcome, RetryPolicy, WorkflowSpec
from mayfly.runtime import HandlerRegistry, HandlerRequest, WaitForSignal, new_signal_token

__all__ = [
    "DEMO_SPEC",
    "DEMO_WORKFLOW_ID",
    "HANDLERS_MODULE",
    "crash_at",
    "register",
    "register_demo_handlers",
    "set_approval_notifier",
]

HANDLERS_MODULE = "mayfly.demo"
"""What ``--handlers`` names to serve a demo run (``mayfly resume RUN --handlers mayfly.demo``)."""

DEMO_WORKFLOW_ID = "mayfly.demo.code-review"

DEMO_SPEC = WorkflowSpec(
    workflow_id=DEMO_WORKFLOW_ID,
    version=1,
    nodes=(
        Node("plan", handler="demo.plan@1", input={"ticket": "MAY-42", "title": "Add jitter to retries"}),
        Node("implement", handler="demo.implement@1", depends_on=("plan",)),
        Node("review", handler="demo.review@1"),
        Node(
            "qa",
            handler="demo.qa@1",
            depends_on=("review",),
            retry=RetryPolicy(
                max_attempts=3, backoff=ExponentialBackoff(initial_ms=400, multiplier=2, maximum_ms=5_000)
            ),
        ),
        Node("approval", handler="demo.approval@1", depends_on=("qa",), retry=RetryPolicy(max_attempts=2)),
        Node("publish", handler="demo.publish@1", depends_on=("approval",)),
    ),
    edges=(
        Edge("implement", "review", when=OnOutcome(Kind.SUCCEEDED)),
        Edge("review", "implement", when=OnOutcome(Kind.CHANGES_REQUESTED)),
    ),
    initial=("plan",),
)
"""The demo specification (validated in the test suite like any other)."""

APPROVAL_TIMEOUT_MS = 7 * 24 * 3_600_000
"""The approval waits up to a week of run time before it expires (and is retried once)."""

_DEFAULT_PAUSE = 0.15
_crash_at: str | None = None
_notify: Callable[[str, str, str], None] | None = None


def crash_at(node_id: str | None) -> None:
    """Make this process kill itself (SIGKILL) when ``node_id``'s handler is first invoked."""
    global _crash_at  # noqa: PLW0603  # a demo switch set once by the CLI before the run starts
    _crash_at = node_id


def set_approval_notifier(notify: Callable[[str, str, str], None] | None) -> None:
    """Install what is told ``(run_id, node_id, raw_token)`` when an approval is requested."""
    global _notify  # noqa: PLW0603  # the demo's "send an email to the approver", set by the CLI
    _notify = notify


def _pause() -> float:
    """Seconds each step pretends to work: ``$MAYFLY_DEMO_PAUSE``, else (or if unusable) 0.15."""
    # Read per call, never at import: a bad value must not break importing the handlers.
    try:
        pause = float(os.environ.get("MAYFLY_DEMO_PAUSE", _DEFAULT_PAUSE))
    except ValueError:
        return _DEFAULT_PAUSE
    return min(max(pause, 0.0), 60.0) if math.isfinite(pause) else _DEFAULT_PAUSE


def _work(req: HandlerRequest) -> None:
    """Pretend to work for a moment, and crash here if the demo was asked to."""
    if _crash_at == req.node_id:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(_pause())


def plan(req: HandlerRequest) -> NodeOutcome:
    """Break the ticket into steps."""
    _work(req)
    ticket = req.input["ticket"]
    return Succeeded(output={"ticket": ticket, "steps": ["schedule", "jitter", "tests"]})


def implement(req: HandlerRequest) -> NodeOutcome:
    """Write a patch; each correction round produces a new revision (deduplicated by idempotency key)."""
    _work(req)
    revision = req.node_attempts
    digest = hashlib.sha256(f"{req.idempotency_key}:{revision}".encode()).hexdigest()[:12]
    return Succeeded(output={"revision": revision, "diff_sha": digest})


def review(req: HandlerRequest) -> NodeOutcome:
    """Request changes on the first revision, approve the second."""
    _work(req)
    revision = req.output_of("implement")["revision"]
    if revision < 2:
        return ChangesRequested(reason="tests missing for the jitter path")
    return Succeeded(output={"verdict": "lgtm", "revision": revision})


def qa(req: HandlerRequest) -> NodeOutcome:
    """Run the test suite; the first attempt hits a flaky integration test."""
    _work(req)
    if req.attempt == 1:
        return RetryableFailure(reason="flaky integration test: connection reset by peer")
    return Succeeded(output={"tests": 128, "failures": 0})


def approval(req: HandlerRequest) -> Any:
    """Ask a human to approve; resume with their decision."""
    if req.signal is None:
        token = new_signal_token()
        if _notify is not None:
            _notify(req.run_id, req.node_id, token.reveal())
        return WaitForSignal("approval", token, timeout_ms=APPROVAL_TIMEOUT_MS)
    decision = req.signal.decision if isinstance(req.signal.decision, dict) else {}
    if decision.get("decision") == "approve":
        return Succeeded(output={"approved_by": decision.get("by", "unknown")})
    return PermanentFailure(reason=f"release rejected by {decision.get('by', 'unknown')}")


def publish(req: HandlerRequest) -> NodeOutcome:
    """Publish the release."""
    _work(req)
    return Succeeded(output={"published": "v1.2.0", "approved_by": req.output_of("approval")["approved_by"]})


def register_demo_handlers(registry: HandlerRegistry) -> None:
    """Register the six demo handlers (``demo.plan@1`` ...)."""
    for name, fn in (
        ("plan", plan),
        ("implement", implement),
        ("review", review),
        ("qa", qa),
        ("publish", publish),
    ):
        registry.register(f"demo.{name}", 1, fn)
    # The approval only decides; it never blocks, so it runs directly on the hub.
    registry.register("demo.approval", 1, approval, cooperative=True)


def register(registry: HandlerRegistry) -> None:
    """Register the demo handlers: what ``--handlers mayfly.demo`` calls."""
    register_demo_handlers(registry)
