"""Golden fixtures: the exact bytes of every serialized form are compatibility gates.

Set ``MAYFLY_UPDATE_GOLDEN=1`` to write fixtures that do not exist yet. Existing
fixtures are never rewritten by the test: changing one is a format change.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from samples import RETRYABLE, SAMPLE_EVENTS, SPEC

from mayfly.model.events import EVENT_SCHEMA_VERSIONS, EVENT_TYPES, RunCreated
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import RunState, RunStateRecord
from mayfly.reducer import decode_event, encode_event, reduce
from mayfly.testing import ReducerHarness

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "golden"
UPDATE = os.environ.get("MAYFLY_UPDATE_GOLDEN") == "1"


def golden(name: str, data: bytes) -> bytes:
    path = FIXTURES / name
    if not path.exists():
        if not UPDATE:
            pytest.fail(f"missing golden fixture {path}; run with MAYFLY_UPDATE_GOLDEN=1 to create it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data + b"\n")
    return path.read_bytes().rstrip(b"\n")


def test_every_event_type_has_a_sample() -> None:
    """Adding an event type without a golden sample fails this test."""
    assert sorted(SAMPLE_EVENTS) == sorted(EVENT_TYPES)


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_event_encoding_matches_its_fixture(event_type: str) -> None:
    """Each event type encodes to, and decodes from, its pinned fixture bytes."""
    sample = SAMPLE_EVENTS[event_type]
    encoded = encode_event(sample)
    version = EVENT_SCHEMA_VERSIONS[event_type]
    assert (encoded.event_type, encoded.schema_version) == (event_type, version)
    expected = golden(f"events/{event_type}.v{version}.json", encoded.payload)
    assert encoded.payload == expected
    assert decode_event(event_type, version, expected) == sample


def test_spec_encoding_matches_its_fixture() -> None:
    """The specification's canonical JSON and content hash are pinned."""
    expected = golden("spec.v1.json", SPEC.to_json())
    assert SPEC.to_json() == expected
    assert WorkflowSpec.from_json(expected) == SPEC
    assert golden("spec.v1.sha256", SPEC.content_hash().encode()) == SPEC.content_hash().encode()


def test_state_encoding_matches_its_fixture() -> None:
    """A run state part-way through retries, with outcomes and budgets, has pinned bytes."""
    run = ReducerHarness(SPEC, input={"ticket": 42})
    run.start("plan")
    run.complete("plan", RETRYABLE)
    run.advance(1000)
    run.start("plan")
    run.complete("plan", SAMPLE_EVENTS["NodeOutcomeCommitted"].outcome)  # type: ignore[union-attr]
    run.start("implement")
    data = msgspec.json.encode(run.state.to_record())
    expected = golden("state.v1.json", data)
    assert data == expected
    restored = RunState.from_record(msgspec.json.decode(expected, type=RunStateRecord))
    assert restored.to_record() == run.state.to_record()


def test_run_created_with_an_epoch_matches_its_fixture_and_the_old_bytes_still_decode() -> None:
    """The additive epoch_ms field has its own fixture; a RunCreated without it keeps its old bytes."""
    plain = SAMPLE_EVENTS["RunCreated"]
    assert isinstance(plain, RunCreated) and plain.epoch_ms is None
    with_epoch = msgspec.structs.replace(plain, epoch_ms=1_767_225_600_000)
    encoded = encode_event(with_epoch)
    assert encoded.schema_version == EVENT_SCHEMA_VERSIONS["RunCreated"]
    expected = golden(f"events/RunCreated.v{encoded.schema_version}.epoch_ms.json", encoded.payload)
    assert encoded.payload == expected
    assert decode_event("RunCreated", encoded.schema_version, expected) == with_epoch
    old = golden(f"events/RunCreated.v{encoded.schema_version}.json", encode_event(plain).payload)
    assert b"epoch_ms" not in old
    assert decode_event("RunCreated", encoded.schema_version, old) == plain


def test_state_with_an_epoch_matches_its_fixture() -> None:
    """A state of a run created with an epoch carries it in its record, with pinned bytes."""
    commands = ReducerHarness(SPEC, input={"ticket": 42})
    created = msgspec.structs.replace(commands.history[0], epoch_ms=1_767_225_600_000)
    state = reduce(None, created, 1)
    data = msgspec.json.encode(state.to_record())
    expected = golden("state.v1.epoch_ms.json", data)
    assert data == expected
    restored = RunState.from_record(msgspec.json.decode(expected, type=RunStateRecord))
    assert restored.epoch_ms == 1_767_225_600_000
    assert restored.to_record() == state.to_record()
