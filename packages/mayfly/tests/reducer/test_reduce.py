"""reduce and the event codec: total over supported versions, fail closed on everything else."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest
from conftest import node, workflow

from mayfly.model.errors import CompatibilityError, CorruptionError
from mayfly.model.events import (
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RunCompleted,
    VirtualTimeAdvanced,
)
from mayfly.model.outcomes import PermanentFailure, Succeeded
from mayfly.reducer import decode_event, encode_event, reduce, reduce_encoded, replay
from mayfly.testing import ReducerHarness


def finished_run() -> ReducerHarness:
    run = ReducerHarness(workflow(node("a"), node("b", "a")))
    run.start("a")
    run.complete("a", Succeeded())
    return run


def test_history_must_start_with_run_created() -> None:
    """Any other first event, or RunCreated not at sequence 1, is corruption."""
    with pytest.raises(CorruptionError, match="must start with RunCreated"):
        reduce(None, NodeReady(node_id="a", cause="initial"), 1)
    run = finished_run()
    with pytest.raises(CorruptionError):
        reduce(None, run.history[0], 2)


def test_a_gap_in_sequence_fails_closed() -> None:
    """Skipping a sequence number raises CorruptionError naming the expected sequence."""
    run = finished_run()
    state = replay(run.history[:2])
    with pytest.raises(CorruptionError, match="expected sequence 3, found 4"):
        reduce(state, run.history[3], 4)


@pytest.mark.parametrize(
    ("index", "event", "problem"),
    [
        (2, NodeReady(node_id="a", cause="initial"), "not pending"),
        (
            2,
            NodeStarted(node_id="zz", attempt_id="00000000-0000-7000-8000-0000000000ff", attempt=1, at=0),
            "unknown node",
        ),
        (
            2,
            NodeStarted(node_id="b", attempt_id="00000000-0000-7000-8000-0000000000ff", attempt=1, at=0),
            "not ready",
        ),
        (2, RunCompleted(result="succeeded", at=0), "not terminal"),
        (2, VirtualTimeAdvanced(to=0), "does not advance"),
    ],
)
def test_contradictory_events_fail_closed(index: int, event: Any, problem: str) -> None:
    """An event the state cannot accept raises CorruptionError naming sequence and event."""
    run = finished_run()
    state = replay(run.history[:index])
    with pytest.raises(CorruptionError, match=problem):
        reduce(state, event, index + 1)


def test_a_second_terminal_outcome_for_an_attempt_is_corruption() -> None:
    """Replaying a conflicting outcome for a committed attempt fails closed (committed-once)."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    attempt = run.start("a", "b")["a"]
    run.complete("a", Succeeded())
    with pytest.raises(CorruptionError, match=r"not active|already"):
        reduce(
            run.replayed(),
            NodeOutcomeCommitted(node_id="a", outcome=PermanentFailure(reason="x"), attempt_id=attempt),
            len(run.history) + 1,
        )


def test_events_after_run_completion_are_corruption() -> None:
    """Nothing may follow RunCompleted."""
    run = ReducerHarness(workflow(node("a")))
    run.start("a")
    run.complete("a", Succeeded())
    with pytest.raises(CorruptionError, match="already completed"):
        reduce(run.replayed(), VirtualTimeAdvanced(to=5), len(run.history) + 1)


def test_codec_round_trips_every_event_of_a_run() -> None:
    """Encoding then decoding each recorded event gives the same event."""
    for event in finished_run().history:
        encoded = encode_event(event)
        assert decode_event(encoded.event_type, encoded.schema_version, encoded.payload) == event


def test_unknown_event_type_fails_closed() -> None:
    """An event type this code does not know is a CompatibilityError, never skipped."""
    with pytest.raises(CompatibilityError, match="unknown event type 'NodeTeleported'"):
        decode_event("NodeTeleported", 1, b'{"type":"NodeTeleported"}')


@pytest.mark.parametrize("version", [0, 2, 99])
def test_unknown_event_version_fails_closed(version: int) -> None:
    """Newer or nonsensical versions of a known type fail closed, naming the version."""
    with pytest.raises(CompatibilityError, match=f"version {version}"):
        decode_event("NodeReady", version, b'{"type":"NodeReady","node_id":"a","cause":"initial"}')


def test_invalid_payload_is_corruption_with_its_path() -> None:
    """A payload with a wrong field type is corruption and the message locates it."""
    with pytest.raises(CorruptionError, match=r"\$\.node_id"):
        decode_event("NodeReady", 1, b'{"type":"NodeReady","node_id":7,"cause":"initial"}')


def test_a_payload_nested_too_deeply_to_decode_is_corruption() -> None:
    """A payload deeper than the decoder can recurse is a CorruptionError, never a RecursionError."""
    payload = (
        b'{"type":"SignalAccepted","signal_id":"0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a62","node_id":"a",'
        b'"attempt_id":"0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a60","name":"go","at":0,"decision":'
        + b"[" * 5000
        + b"]" * 5000
        + b"}"
    )
    with pytest.raises(
        CorruptionError, match="SignalAccepted v1 payload is invalid: nested too deeply to decode"
    ):
        decode_event("SignalAccepted", 1, payload)


def test_upcasters_lift_older_versions_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """With NodeReady at v3, a v1 payload is lifted by the v1->v2 then v2->v3 upcasters."""
    from mayfly.reducer import codec

    monkeypatch.setitem(codec.EVENT_SCHEMA_VERSIONS, "NodeReady", 3)
    calls: list[str] = []

    def v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
        calls.append("1->2")
        renamed = dict(body)
        renamed["node_id"] = renamed.pop("node")
        return renamed

    def v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
        calls.append("2->3")
        return body

    upcasters = {("NodeReady", 1): v1_to_v2, ("NodeReady", 2): v2_to_v3}
    old = msgspec.json.encode({"type": "NodeReady", "node": "plan", "cause": "initial"})
    assert decode_event("NodeReady", 1, old, upcasters=upcasters) == NodeReady(
        node_id="plan", cause="initial"
    )
    assert calls == ["1->2", "2->3"]
    with pytest.raises(CompatibilityError, match="no upcaster registered for NodeReady v2 -> v3"):
        decode_event("NodeReady", 1, old, upcasters={("NodeReady", 1): v1_to_v2})


class Record(NamedTuple):
    sequence: int
    event_type: str
    schema_version: int
    payload: bytes


def records_of(run: ReducerHarness) -> list[Record]:
    encoded = [encode_event(event) for event in run.history]
    return [Record(k, e.event_type, e.schema_version, e.payload) for k, e in enumerate(encoded, 1)]


def out_of_order(sequence: int, after: int) -> CorruptionError:
    return CorruptionError(f"record {sequence} after {after}")


def test_reduce_encoded_equals_decoding_and_reducing_each_record() -> None:
    """The fused loop derives the state replaying the decoded events derives, from scratch or a prefix."""
    run = finished_run()
    records = records_of(run)
    state = reduce_encoded(None, records, out_of_order=out_of_order)
    assert state is not None and state.to_record() == replay(run.history).to_record()
    prefix = reduce_encoded(None, records[:3], out_of_order=out_of_order)
    assert prefix is not None
    rest = reduce_encoded(prefix, records[3:], out_of_order=out_of_order)
    assert rest is prefix and rest.to_record() == state.to_record()
    assert reduce_encoded(None, [], out_of_order=out_of_order) is None


@pytest.mark.parametrize(
    ("event_type", "version", "payload"),
    [
        ("NodeReady", 1, b'{"type":"NodeReady","node_id":7,"cause":"initial"}'),
        ("NodeReady", 1, b'{"type":"NodeReady",'),
        ("NodeReady", 2, b'{"type":"NodeReady","node_id":"b","cause":"initial"}'),
        ("NodeTeleported", 1, b'{"type":"NodeTeleported"}'),
        ("SignalAccepted", 1, b'{"type":"SignalAccepted","decision":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ],
)
def test_reduce_encoded_fails_a_bad_record_exactly_as_decode_event(
    event_type: str, version: int, payload: bytes
) -> None:
    """A record that does not decode raises decode_event's own error type and text."""
    records = records_of(finished_run())
    with pytest.raises((CorruptionError, CompatibilityError)) as expected:
        decode_event(event_type, version, payload)
    bad = Record(len(records) + 1, event_type, version, payload)
    with pytest.raises(type(expected.value)) as raised:
        reduce_encoded(None, [*records, bad], out_of_order=out_of_order)
    assert str(raised.value) == str(expected.value)


def test_reduce_encoded_reports_a_record_out_of_order_and_reduces_by_the_rules() -> None:
    """A sequence that does not follow raises the caller's error; a contradictory event, reduce's."""
    records = records_of(finished_run())
    with pytest.raises(CorruptionError, match=r"^record 5 after 3$"):
        reduce_encoded(None, [*records[:3], records[4]], out_of_order=out_of_order)
    again = Record(len(records) + 1, records[2].event_type, 1, records[2].payload)
    with pytest.raises(CorruptionError) as raised:
        reduce_encoded(None, [*records, again], out_of_order=out_of_order)
    state = replay(finished_run().history)
    with pytest.raises(CorruptionError) as expected:
        reduce(state, decode_event(again.event_type, 1, again.payload), again.sequence)
    assert str(raised.value) == str(expected.value)


def test_reduce_encoded_upcasts_older_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record at an older version goes through the registered upcasters, as decode_event does."""
    from mayfly.reducer import codec

    run = finished_run()
    records = records_of(run)
    monkeypatch.setitem(codec.EVENT_SCHEMA_VERSIONS, "NodeReady", 2)
    lifted: list[str] = []

    def v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
        lifted.append(body["node_id"])
        return body

    state = reduce_encoded(None, records, out_of_order=out_of_order, upcasters={("NodeReady", 1): v1_to_v2})
    assert state is not None and state.to_record() == run.state.to_record()
    assert lifted == [e.node_id for e in run.history if isinstance(e, NodeReady)]
