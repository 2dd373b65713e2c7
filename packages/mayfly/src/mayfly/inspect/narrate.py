"""Event narration: the one payload-free sentence each event is told by, everywhere.

The CLI's live timeline, an inspection's diagnostic history and any console
print what :func:`narrate` says, so an event reads the same wherever it
appears. A narration never holds run input, node input, outcome output, child
input or output, signal decisions or tokens: it is built field by field from
the event, and only a non-success outcome's bounded *reason* (the
operator-safe channel, at most 4 KiB) travels beside it, for views that show
reasons (the live timeline) to add.
"""

from __future__ import annotations

from typing import final

import msgspec

from mayfly.model.events import (
    AttemptDeadlineExpired,
    BudgetExhausted,
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    EdgeActivated,
    Event,
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
from mayfly.model.outcomes import RetryableFailure

__all__ = ["Narration", "history_line", "narrate"]


@final
class Narration(msgspec.Struct, frozen=True):
    """How one event is told: who it concerns, what happened, and the reason beside it.

    ``subject`` is the node the event concerns (``None`` for the run
    itself), ``text`` the payload-free, reason-free rest of the sentence.
    ``reason`` is the bounded reason of a non-success outcome, the failure
    detail of a failed node or the reason of a cancellation (empty
    otherwise); it may span lines. ``bookkeeping`` marks facts a live view
    may leave out (time advancing).
    """

    subject: str | None
    text: str
    reason: str = ""
    bookkeeping: bool = False

    @property
    def line(self) -> str:
        """The sentence: its subject (``run`` for the run itself), then its text."""
        return f"{self.subject or 'run'} {self.text}".rstrip()


def narrate(event: Event) -> Narration:
    """The narration of ``event``, e.g. ``Narration("review", "changes_requested", "tests missing")``."""
    if isinstance(event, RunCreated):
        spec = event.spec
        return Narration(None, f"created: {spec.workflow_id}@{spec.version} ({len(spec.nodes)} nodes)")
    if isinstance(event, NodeReady):
        return Narration(event.node_id, f"ready ({event.cause})")
    if isinstance(event, EdgeActivated):
        return Narration(event.target, f"activated by {event.source} (edge {event.edge})")
    if isinstance(event, NodeStarted):
        return Narration(event.node_id, f"started attempt {event.attempt} at {event.at} ms")
    if isinstance(event, NodeOutcomeCommitted):
        outcome = event.outcome
        text = outcome.kind.value
        if isinstance(outcome, RetryableFailure) and outcome.timeout:
            text += " (timeout)"
        if event.attempt_id is None:
            text += " (assigned)"
        return Narration(event.node_id, text, outcome.reason)
    if isinstance(event, NodeFailed):
        return Narration(event.node_id, f"failed ({event.cause.value})", event.detail)
    if isinstance(event, RetryScheduled):
        return Narration(
            event.node_id,
            f"retry {event.next_attempt} scheduled in {event.delay_ms} ms (at {event.deadline} ms)",
        )
    if isinstance(event, RetryReleased):
        return Narration(event.node_id, f"retry {event.next_attempt} released at {event.at} ms")
    if isinstance(event, ChildStarted):
        return Narration(
            event.node_id,
            f"started attempt {event.attempt} as child run of {event.workflow_id}@{event.version}",
        )
    if isinstance(event, ChildCompleted):
        return Narration(event.node_id, f"child run {event.result}")
    if isinstance(event, VirtualTimeAdvanced):
        return Narration(None, f"time advanced to {event.to} ms", bookkeeping=True)
    if isinstance(event, AttemptDeadlineExpired):
        return Narration(event.node_id, f"attempt deadline expired at {event.deadline} ms")
    if isinstance(event, BudgetExhausted):
        return Narration(
            None, f"budget {event.kind.value} exhausted: limit {event.limit}, observed {event.observed}"
        )
    if isinstance(event, CancellationRequested):
        return Narration(
            None,
            f"cancellation requested by {event.requester} ({len(event.targets)} targets)",
            event.reason,
        )
    if isinstance(event, RunCompleted):
        return Narration(None, event.result)
    if isinstance(event, SignalWaitOpened):
        until = "no deadline" if event.deadline is None else f"until {event.deadline} ms"
        return Narration(event.node_id, f"waiting for signal {event.name!r} ({until})")
    if isinstance(event, SignalAccepted):
        # Never the decision: it is handler data.
        return Narration(event.node_id, f"signal {event.name!r} accepted")
    if isinstance(event, SignalRejected):
        return Narration(event.node_id, f"signal rejected ({event.reason.value})")
    if isinstance(event, SignalExpired):
        return Narration(event.node_id, f"signal wait {event.name!r} expired at {event.deadline} ms")
    # Unreachable while every event type has a branch above. A new type lands here at run time
    # (named by its history line, payload-free) and makes this ignore unused, so mypy asks for a branch.
    node_id = getattr(event, "node_id", None)  # type: ignore[unreachable]
    return Narration(node_id if isinstance(node_id, str) else None, "")


def history_line(event: Event) -> str:
    """The event's type and narration, without its sequence, e.g. ``NodeReady plan ready (initial)``.

    The type already says an event is the run's own (``RunCompleted succeeded``), so the subject
    ``run`` is left out there.
    """
    narration = narrate(event)
    told = narration.text if narration.subject is None else narration.line
    return f"{type(event).__name__} {told}".rstrip()
