"""Durable approvals through the runtime: park, deliver from outside, resume the same attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mayfly import HandlerRegistry, HandlerRequest, Node, RetryPolicy, RunStatus, Succeeded, WorkflowSpec
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import RejectionCode
from mayfly.model.errors import CommandRejected, InvalidSignalToken
from mayfly.model.outcomes import PermanentFailure
from mayfly.model.signals import SignalToken
from mayfly.model.state import NodeStatus
from mayfly.recovery import RestoreSignalWait, resume_run
from mayfly.runtime import WaitForSignal, WorkflowRuntime, new_signal_token
from mayfly.substrate import VirtualClock

TOKENS: dict[str, str] = {}


def approval(req: HandlerRequest) -> Any:
    if req.signal is None:
        token = new_signal_token()
        TOKENS[req.run_id] = token.reveal()
        return WaitForSignal("approval", token, timeout_ms=86_400_000)
    verdict = req.signal.decision["verdict"]
    return (
        Succeeded(output={"approved_by": req.signal.decision["by"]})
        if verdict == "approve"
        else PermanentFailure(reason="rejected")
    )


SPEC = WorkflowSpec(
    workflow_id="approvals",
    version=1,
    nodes=(
        Node("draft", handler="draft@1"),
        Node("approval", handler="approval@1", depends_on=("draft",), retry=RetryPolicy(max_attempts=1)),
        Node("publish", handler="publish@1", depends_on=("approval",)),
    ),
)


def runtime(root: Path, **kwargs: Any) -> WorkflowRuntime:
    url = f"file://{root}/j?durability=write"
    registry = HandlerRegistry()
    registry.register("draft", 1, lambda req: Succeeded())
    registry.register("approval", 1, approval)
    registry.register("publish", 1, lambda req: Succeeded(output=req.output_of("approval")))
    return WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url), **kwargs)


def test_a_run_parks_on_its_approval_and_resumes_after_the_signal(tmp_path: Path) -> None:
    """execute returns while the approval waits; a later signal and resume finish the same attempt."""
    first = runtime(tmp_path)
    parked = first.execute(SPEC)
    assert parked.status is RunStatus.RUNNING
    assert parked.waiting == {"approval": "approval"}
    session = resume_run(first.journal, first.leases, parked.run_id, owner="inspector")
    with session:
        (effect,) = session.effects
        assert isinstance(effect, RestoreSignalWait) and effect.deadline is not None
        assert 86_400_000 <= effect.deadline < 86_460_000  # opened at real virtual time, a few ms in
        attempt_id = effect.attempt_id

    # Another process (here: another runtime object) delivers the signal, then resumes the run.
    second = runtime(tmp_path)
    wrong = second.signal(
        parked.run_id, "approval", "this-is-not-the-token", {"verdict": "approve", "by": "eve"}
    )
    assert (wrong.status, wrong.reason) == ("rejected", "token_mismatch")
    accepted = second.signal(
        parked.run_id, "approval", TOKENS[parked.run_id], {"verdict": "approve", "by": "alice"}
    )
    assert accepted.status == "accepted"
    again = second.signal(
        parked.run_id,
        "approval",
        TOKENS[parked.run_id],
        {"verdict": "approve", "by": "alice"},
        signal_id=accepted.signal_id,
    )
    assert again.status == "already_consumed"
    done = second.resume(parked.run_id)
    assert done.status is RunStatus.SUCCEEDED
    assert done.outputs["publish"] == {"approved_by": "alice"}
    assert done.nodes["approval"].attempts == 1  # the same attempt resumed, no new attempt id
    state = second.journal.read(parked.run_id)
    assert attempt_id in b"".join(r.payload for r in state).decode()


def test_an_unanswered_wait_expires_on_the_virtual_clock(tmp_path: Path) -> None:
    """Without detaching, the hub waits until the wait's deadline and records a terminal timeout."""
    result = runtime(tmp_path, clock=VirtualClock).execute(SPEC, detach_on_wait=False)
    assert result.status is RunStatus.FAILED
    assert result.nodes["approval"].status is NodeStatus.FAILED
    assert "signal wait 'approval' expired at 86400000 ms" in result.nodes["approval"].reason
    assert result.nodes["publish"].status is NodeStatus.SKIPPED


@pytest.mark.parametrize(
    "token",
    [
        "too-short",
        "x" * 1025,
        "has spaces in the middle",
        "n\u00f8n-ascii-token-0123456789",
        "tab\tin-the-token-0123",
    ],
)
def test_a_malformed_token_is_a_typed_rejection_that_changes_nothing(tmp_path: Path, token: str) -> None:
    """signal() refuses a malformed token with CommandRejected (invalid_input) before taking the lease."""
    rt = runtime(tmp_path)
    parked = rt.execute(SPEC)
    with rt.leases.acquire(parked.run_id, "probe", 5_000) as lease:
        fence = lease.fencing_token
    before = (rt.journal.next_sequence(parked.run_id), rt.journal.read(parked.run_id))
    with pytest.raises(CommandRejected) as caught:
        rt.signal(parked.run_id, "approval", token, {"verdict": "approve", "by": "eve"})
    assert caught.value.rejection.code is RejectionCode.INVALID_INPUT  # type: ignore[attr-defined]
    assert str(caught.value).startswith(
        f"signal rejected: invalid_input: signal to run {parked.run_id} node 'approval'"
    )
    assert token not in str(caught.value)  # a mistyped secret is still a secret
    assert (rt.journal.next_sequence(parked.run_id), rt.journal.read(parked.run_id)) == before
    with rt.leases.acquire(parked.run_id, "probe", 5_000) as lease:
        assert lease.fencing_token == fence + 1  # no lease was granted in between


def test_a_malformed_token_raises_invalid_signal_token() -> None:
    """SignalToken's own refusal is a typed ValueError whose message never shows the token."""
    with pytest.raises(InvalidSignalToken, match=r"16\.\.1024 characters") as caught:
        SignalToken("secret")
    assert isinstance(caught.value, ValueError) and "secret" not in str(caught.value)


def test_commands_for_a_run_that_does_not_exist_leave_nothing_behind(tmp_path: Path) -> None:
    """signal and resume of an unknown run raise RunNotFound and create no lease or fencing state."""
    from mayfly.model.errors import RunNotFound

    rt = runtime(tmp_path)
    ghost = rt.ids.new_id()
    store = tmp_path / "j"
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    with pytest.raises(RunNotFound):
        rt.signal(ghost, "approval", new_signal_token().reveal(), {"verdict": "approve"})
    with pytest.raises(RunNotFound):
        rt.resume(ghost)
    with pytest.raises(RunNotFound):
        resume_run(rt.journal, rt.leases, ghost, owner="test")
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_cancelling_a_run_that_was_never_created_leaves_nothing_behind(tmp_path: Path) -> None:
    """cancel_run_cascade over a run id with no history (a child never created) writes no lease or fence."""
    from mayfly.runtime import cancel_run_cascade

    rt = runtime(tmp_path)
    store = tmp_path / "j"
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    cancel_run_cascade(
        rt.journal, rt.leases, rt.ids.new_id(), requester="test", reason="x", owner="test", ids=rt.ids
    )
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
