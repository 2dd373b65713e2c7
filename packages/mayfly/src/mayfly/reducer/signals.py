"""Decisions about durable signals: opening a wait and delivering a signal (ADR-0032 Story 1.8).

Delivery dispositions, in the order they are checked:

- an unknown run or node, or a malformed signal id or decision, is a typed
  command rejection and nothing is written;
- a signal id the run already consumed returns the typed
  ``signal_already_consumed`` disposition with no new fact (so a duplicate of
  an accepted signal is idempotent);
- a node that is not waiting (``expired`` if its last wait expired), a name
  or a token that does not match, records ``SignalRejected``, which consumes
  the signal id;
- otherwise ``SignalAccepted`` consumes the id and the attempt resumes.

Wait expiry is decided with the other deadlines when virtual time advances.
"""

from __future__ import annotations

from mayfly.model.commands import DeliverSignal, OpenSignalWait, Rejection, RejectionCode
from mayfly.model.events import Event, SignalAccepted, SignalRejected, SignalWaitOpened
from mayfly.model.ids import is_node_id, is_uuid
from mayfly.model.signals import SignalRejection, is_token_digest
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.reducer._draft import Draft
from mayfly.reducer.validate import check_input

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_RUNNING = NodeStatus.RUNNING
_RUN_RUNNING = RunStatus.RUNNING
_WAITING = NodeStatus.WAITING


__all__ = ["deliver_signal", "open_signal_wait"]


def open_signal_wait(state: RunState, command: OpenSignalWait) -> Draft | list[Event] | Rejection:
    """A running attempt's request to wait for a signal."""
    node = state.node_by_id(command.node_id)
    if node is None:
        return Rejection(RejectionCode.UNKNOWN_NODE, f"run {state.run_id} has no node {command.node_id!r}")
    if node.attempt_id != command.attempt_id:
        return Rejection(
            RejectionCode.ATTEMPT_NOT_ACTIVE,
            f"attempt {command.attempt_id} is not the active attempt of node {command.node_id!r}",
        )
    if node.status is not _RUNNING or node.child_run_id is not None:
        return Rejection(
            RejectionCode.NOT_RUNNING,
            f"node {command.node_id!r} is {node.status.value}; only a running handler can wait",
        )
    if not is_node_id(command.name):
        return Rejection(RejectionCode.INVALID_INPUT, f"invalid signal name {command.name!r}")
    if not is_token_digest(command.token_sha256):
        return Rejection(RejectionCode.INVALID_INPUT, "token_sha256 must be 'sha256:' and 64 hex digits")
    if command.timeout_ms is not None and command.timeout_ms < 1:
        return Rejection(
            RejectionCode.INVALID_INPUT, f"wait timeout must be >= 1 ms, got {command.timeout_ms}"
        )
    deadline = None if command.timeout_ms is None else state.now + command.timeout_ms
    draft = Draft(state)
    draft.emit(
        SignalWaitOpened(
            node_id=command.node_id,
            attempt_id=command.attempt_id,
            name=command.name,
            token_sha256=command.token_sha256,
            at=state.now,
            deadline=deadline,
        )
    )
    return draft


def deliver_signal(state: RunState, command: DeliverSignal) -> Draft | list[Event] | Rejection:
    """The disposition of a delivered signal (see the module docstring)."""
    node = state.node_by_id(command.node_id)
    if node is None:
        return Rejection(RejectionCode.UNKNOWN_NODE, f"run {state.run_id} has no node {command.node_id!r}")
    if not is_uuid(command.signal_id):
        return Rejection(
            RejectionCode.INVALID_INPUT, f"invalid signal id {command.signal_id!r}: expected a UUID"
        )
    consumed = state.consumed_signal(command.signal_id)
    if consumed is not None:
        verdict = "accepted" if consumed.accepted else f"rejected ({consumed.rejection.value})"  # type: ignore[union-attr]
        return Rejection(
            RejectionCode.SIGNAL_ALREADY_CONSUMED,
            f"signal {command.signal_id} was already consumed by node {consumed.node_id!r}: {verdict}",
        )
    if state.status is not _RUN_RUNNING:
        return Rejection(
            RejectionCode.RUN_TERMINAL,
            f"run {state.run_id} already {state.status.value}; it accepts no more signals",
        )
    try:
        check_input(command.decision, "signal decision")
    except ValueError as exc:
        return Rejection(RejectionCode.INVALID_INPUT, str(exc))
    wait = node.wait
    reason: SignalRejection | None = None
    if node.status is not _WAITING or wait is None:
        reason = SignalRejection.EXPIRED if node.wait_expired else SignalRejection.NOT_WAITING
    elif command.name is not None and command.name != wait.name:
        reason = SignalRejection.NAME_MISMATCH
    elif command.token.digest != wait.token_sha256:
        reason = SignalRejection.TOKEN_MISMATCH
    draft = Draft(state)
    if reason is not None:
        draft.emit(
            SignalRejected(signal_id=command.signal_id, node_id=command.node_id, reason=reason, at=state.now)
        )
        return draft
    assert wait is not None and node.attempt_id is not None
    draft.emit(
        SignalAccepted(
            signal_id=command.signal_id,
            node_id=command.node_id,
            attempt_id=node.attempt_id,
            name=wait.name,
            at=state.now,
            decision=command.decision,
        )
    )
    return draft
