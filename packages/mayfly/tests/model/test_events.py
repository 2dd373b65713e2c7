"""The common event base: every event names the node and attempt it is about, or None."""

from __future__ import annotations

import msgspec
import pytest

from mayfly.model.errors import CorruptionError
from mayfly.model.events import (
    EVENT_TYPES,
    BaseEvent,
    BudgetExhausted,
    BudgetKind,
    EdgeActivated,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RunCompleted,
    SignalAccepted,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import Succeeded
from mayfly.reducer import decode_event, encode_event

ATTEMPT = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b"


def test_every_event_type_has_the_common_base() -> None:
    """Each event type the journal can hold is a BaseEvent."""
    assert all(issubclass(cls, BaseEvent) for cls in EVENT_TYPES.values())


@pytest.mark.parametrize(
    ("event", "node_id", "attempt_id"),
    [
        (NodeReady(node_id="plan", cause="initial"), "plan", None),
        (NodeStarted(node_id="plan", attempt_id=ATTEMPT, attempt=1, at=0), "plan", ATTEMPT),
        (NodeOutcomeCommitted(node_id="plan", outcome=Succeeded()), "plan", None),
        (SignalAccepted(signal_id=ATTEMPT, node_id="ok", attempt_id=ATTEMPT, name="go", at=3), "ok", ATTEMPT),
        (BudgetExhausted(kind=BudgetKind.RUN_ATTEMPTS, limit=1, observed=2), None, None),
        (EdgeActivated(edge=0, source="a", target="b", source_sequence=2), None, None),
        (VirtualTimeAdvanced(to=5), None, None),
        (RunCompleted(result="succeeded", at=5), None, None),
    ],
)
def test_an_event_names_its_node_and_attempt_or_none(
    event: BaseEvent, node_id: str | None, attempt_id: str | None
) -> None:
    """node_id and attempt_id are the event's own fields where it has them, None where it has none."""
    assert (event.node_id, event.attempt_id) == (node_id, attempt_id)


def test_the_base_adds_nothing_to_a_payload() -> None:
    """The base's node_id and attempt_id are not fields: payloads neither carry nor accept them."""
    event = VirtualTimeAdvanced(to=5)
    encoded = encode_event(event)
    assert msgspec.json.decode(encoded.payload) == {"type": "VirtualTimeAdvanced", "to": 5}
    with pytest.raises(CorruptionError, match="node_id"):
        decode_event("VirtualTimeAdvanced", 1, b'{"type":"VirtualTimeAdvanced","to":5,"node_id":"x"}')
