"""Durable signals: waits, deliveries, expiry and redaction (ADR-0032 "Durable external wait", Story 1.8)."""

from __future__ import annotations

import copy
import pickle

import msgspec
import pytest
from conftest import node, workflow

from mayfly.model.commands import DeliverSignal, OpenSignalWait, Rejection, RejectionCode
from mayfly.model.events import (
    CancellationTarget,
    NodeOutcomeCommitted,
    SignalAccepted,
    SignalExpired,
    SignalRejected,
    SignalWaitOpened,
)
from mayfly.model.outcomes import RetryableFailure, Succeeded
from mayfly.model.signals import AcceptedSignal, SignalRejection, SignalToken
from mayfly.model.spec import FixedBackoff, RetryPolicy
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.reducer import encode_event
from mayfly.testing import ReducerHarness

SECRET = "tok-3f9c2a7e1b5d4c8a9e0f"
TOKEN = SignalToken(SECRET)


def waiting(timeout_ms: int | None = 60_000, **retry: object) -> tuple[ReducerHarness, str]:
    """A run whose 'approval' node waits for signal 'approval'."""
    policy = RetryPolicy(**retry) if retry else RetryPolicy()  # type: ignore[arg-type]
    run = ReducerHarness(workflow(node("approval", retry=policy), node("publish", "approval")))
    attempt = run.start("approval")["approval"]
    run.execute(
        OpenSignalWait(
            node_id="approval",
            attempt_id=attempt,
            name="approval",
            token_sha256=TOKEN.digest,
            timeout_ms=timeout_ms,
        )
    )
    return run, attempt


def deliver(
    run: ReducerHarness, token: SignalToken = TOKEN, signal_id: str | None = None, **kw: object
) -> object:
    command = DeliverSignal(
        node_id=str(kw.pop("node_id", "approval")),
        signal_id=signal_id or run.ids.new_id(),
        token=token,
        decision=kw.pop("decision", {"verdict": "approve"}),
        name=kw.pop("name", None),  # type: ignore[arg-type]
    )
    return run.try_execute(command)


def test_opening_a_wait_records_only_the_digest() -> None:
    """SignalWaitOpened carries the token's SHA-256 digest and an absolute deadline; the node waits."""
    run, attempt = waiting()
    assert run.history[-1] == SignalWaitOpened(
        node_id="approval",
        attempt_id=attempt,
        name="approval",
        token_sha256=TOKEN.digest,
        at=0,
        deadline=60_000,
    )
    assert run.state.node_by_id("approval").status is NodeStatus.WAITING  # type: ignore[union-attr]


def test_an_accepted_signal_resumes_the_same_attempt() -> None:
    """Acceptance consumes the signal id; the attempt runs again with the decision attached."""
    run, attempt = waiting()
    signal_id = run.ids.new_id()
    events = deliver(run, signal_id=signal_id)
    assert events == [
        SignalAccepted(
            signal_id=signal_id,
            node_id="approval",
            attempt_id=attempt,
            name="approval",
            at=0,
            decision={"verdict": "approve"},
        )
    ]
    approval = run.state.node_by_id("approval")
    assert approval is not None and approval.status is NodeStatus.RUNNING and approval.attempt_id == attempt
    assert approval.signal == AcceptedSignal(signal_id, "approval", {"verdict": "approve"})
    run.complete("approval", Succeeded(output="approved"))
    assert run.state.node_by_id("approval").signal is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("wrong-token", SignalRejection.TOKEN_MISMATCH),
        ("wrong-name", SignalRejection.NAME_MISMATCH),
        ("not-waiting", SignalRejection.NOT_WAITING),
        ("expired", SignalRejection.EXPIRED),
    ],
)
def test_rejected_deliveries_are_recorded_and_consume_the_id(setup: str, expected: SignalRejection) -> None:
    """Stale, mismatched or conflicting signals cannot advance the run; they are recorded as rejected."""
    run, _ = waiting(max_attempts=2, backoff=FixedBackoff(delay_ms=10**9))
    token, name, node_id = TOKEN, None, "approval"
    if setup == "wrong-token":
        token = SignalToken("not-the-right-token-123")
    elif setup == "wrong-name":
        name = "payment"
    elif setup == "not-waiting":
        node_id = "publish"
    else:
        run.advance(60_000)
    before = run.state.node_by_id("approval").status  # type: ignore[union-attr]
    signal_id = run.ids.new_id()
    events = deliver(run, token=token, signal_id=signal_id, name=name, node_id=node_id)
    assert events == [SignalRejected(signal_id=signal_id, node_id=node_id, reason=expected, at=run.state.now)]
    assert run.state.node_by_id("approval").status is before  # type: ignore[union-attr]
    again = deliver(run, signal_id=signal_id, node_id=node_id)
    assert isinstance(again, Rejection) and again.code is RejectionCode.SIGNAL_ALREADY_CONSUMED


def test_a_duplicate_accepted_signal_is_idempotent() -> None:
    """Re-delivering an accepted signal id returns the already-consumed disposition and writes nothing."""
    run, _ = waiting()
    signal_id = run.ids.new_id()
    deliver(run, signal_id=signal_id)
    before = len(run.history)
    result = deliver(run, signal_id=signal_id)
    assert isinstance(result, Rejection) and result.code is RejectionCode.SIGNAL_ALREADY_CONSUMED
    assert "accepted" in result.message and len(run.history) == before


def test_unknown_nodes_and_bad_ids_are_command_rejections() -> None:
    """A delivery to an unknown node or with a malformed id is rejected and nothing is written."""
    run, _ = waiting()
    before = len(run.history)
    assert deliver(run, node_id="nope").code is RejectionCode.UNKNOWN_NODE  # type: ignore[union-attr]
    assert deliver(run, signal_id="123").code is RejectionCode.INVALID_INPUT  # type: ignore[union-attr]
    assert deliver(run, decision="x" * 70_000).code is RejectionCode.INVALID_INPUT  # type: ignore[union-attr]
    assert len(run.history) == before


def test_expiry_is_recorded_after_time_advances_and_retried() -> None:
    """At the deadline: VirtualTimeAdvanced, SignalExpired, a timeout outcome, then a retry."""
    run, attempt = waiting(backoff=FixedBackoff(delay_ms=10))
    events = run.advance(60_000)
    assert [type(e).__name__ for e in events] == [
        "VirtualTimeAdvanced",
        "SignalExpired",
        "NodeOutcomeCommitted",
        "RetryScheduled",
    ]
    assert events[1] == SignalExpired(
        node_id="approval", attempt_id=attempt, name="approval", deadline=60_000
    )
    outcome = events[2].outcome  # type: ignore[union-attr]
    assert isinstance(outcome, RetryableFailure) and outcome.timeout


def test_expiry_on_the_last_attempt_fails_the_node() -> None:
    """A wait that expires with no attempts left is terminal."""
    run, _ = waiting(max_attempts=1)
    run.advance(60_000)
    assert run.state.node_by_id("approval").status is NodeStatus.FAILED  # type: ignore[union-attr]
    assert run.state.status is RunStatus.FAILED


def test_a_wait_without_deadline_never_expires() -> None:
    """Without a timeout, a wait survives any amount of virtual time."""
    run, _ = waiting(timeout_ms=None)
    run.advance(10**12)
    assert run.state.node_by_id("approval").status is NodeStatus.WAITING  # type: ignore[union-attr]


def test_the_attempt_deadline_is_paused_while_waiting() -> None:
    """An attempt deadline does not fire during a wait and resumes with the time that was left."""
    run = ReducerHarness(workflow(node("a", retry=RetryPolicy(attempt_deadline_ms=1000))))
    attempt = run.start("a")["a"]
    run.advance(400)
    run.execute(OpenSignalWait(node_id="a", attempt_id=attempt, name="go", token_sha256=TOKEN.digest))
    run.advance(50_000)
    assert run.state.node_by_id("a").status is NodeStatus.WAITING  # type: ignore[union-attr]
    deliver(run, node_id="a")
    assert run.state.node_by_id("a").attempt_deadline == 50_600  # type: ignore[union-attr]


def test_waiting_attempts_are_cancellation_targets() -> None:
    """Cancelling a run closes open waits: the waiting attempt is a target and gets a Cancelled outcome."""
    run, attempt = waiting()
    events = run.cancel("superseded")
    assert events[0].targets == (CancellationTarget("approval", attempt),)  # type: ignore[union-attr]
    assert isinstance(events[1], NodeOutcomeCommitted) and events[1].attempt_id == attempt
    assert run.state.node_by_id("approval").wait is None  # type: ignore[union-attr]
    assert run.state.status is RunStatus.CANCELLED


def test_the_raw_token_never_appears_in_any_serialized_byte() -> None:
    """Scan every event payload and the serialized state: only the digest is there."""
    run, _ = waiting(backoff=FixedBackoff(delay_ms=1))
    deliver(run, token=SignalToken("a-wrong-secret-value-xyz"))
    deliver(run)
    run.complete("approval", Succeeded())
    blob = b"".join(encode_event(e).payload for e in run.history)
    blob += msgspec.json.encode(run.state.to_record())
    assert SECRET.encode() not in blob and b"a-wrong-secret-value-xyz" not in blob
    assert TOKEN.digest.encode() in blob
    assert run.replayed().to_record() == run.state.to_record()


def test_tokens_redact_themselves_and_refuse_serialization() -> None:
    """repr, str, format, pickling and msgspec encoding never reveal the secret."""
    for text in (repr(TOKEN), str(TOKEN), f"{TOKEN}", f"{TOKEN!r}", str([TOKEN])):
        assert SECRET not in text
    with pytest.raises(TypeError):
        pickle.dumps(TOKEN)
    with pytest.raises(TypeError):
        msgspec.json.encode(TOKEN)
    assert copy.deepcopy(TOKEN) == TOKEN
    assert TOKEN.reveal() == SECRET


@pytest.mark.parametrize("secret", ["short", "has space in it!!", "x" * 1025, "ünïcode-token-value"])
def test_malformed_tokens_are_rejected(secret: str) -> None:
    """Tokens are 16..1024 printable ASCII characters without spaces."""
    with pytest.raises(ValueError):
        SignalToken(secret)
