"""Fuzzing every entry point that takes outside input: only the documented typed errors escape.

The entry points and the errors docs/api.md promises for them: specification
JSON (``SpecDecodeError``), event payloads (``CompatibilityError``,
``CorruptionError``), journal records (``InvalidRecord``, ``InvalidIdentifier``,
``LimitExceeded``, ``ChecksumMismatch``), snapshots (discarded with a
diagnostic, never raising), CLI JSON arguments (one line and exit 2) and signal
delivery (``CommandRejected``, ``RunNotFound``, ``InvalidIdentifier``). Each
test also checks that rejected input changed nothing.
"""

from __future__ import annotations

import io
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from mayfly import HandlerRegistry, HandlerRequest, Node, RetryPolicy, Succeeded, WorkflowSpec
from mayfly.cli import main
from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import RejectionCode
from mayfly.model.errors import (
    ChecksumMismatch,
    CommandRejected,
    CompatibilityError,
    CorruptionError,
    InvalidIdentifier,
    InvalidRecord,
    LimitExceeded,
    RunNotFound,
    SpecDecodeError,
)
from mayfly.model.events import EVENT_TYPES
from mayfly.model.json import sha256_hex
from mayfly.model.signals import SignalToken
from mayfly.reducer import decode_event, encode_event, validate
from mayfly.runtime import WaitForSignal, WorkflowRuntime
from mayfly.snapshot import make_snapshot, restore_snapshot
from mayfly.testing import ReducerHarness

settings.register_profile("mayfly", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mayfly")

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"
TOKEN = "fuzzing-signal-token-0123456789"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
"""Python values json.dumps can write: NaN and infinities included, as the non-standard tokens."""


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


hostile_texts = st.sampled_from(
    [
        nested(990),
        nested(1_000),
        nested(5_000),
        "9" * 4_301,
        "-" + "9" * 5_000,
        "[" + "1" * 4_400 + "]",
        "1e400",
        "NaN",
        '{"a": Infinity}',
        '"\\ud800"',
        "\x00",
        "{" * 3,
        '{"a": ' + nested(500) + "}",
    ]
)
"""Text that once escaped as a traceback somewhere: depth, long integers, non-finite numbers, junk."""


@st.composite
def mutated(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with a few values, at random paths, replaced by arbitrary JSON values."""
    for _ in range(draw(st.integers(1, 3))):
        document = _replace_somewhere(draw, document)
    return document


def _replace_somewhere(draw: st.DrawFn, value: Any) -> Any:
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _replace_somewhere(draw, value[key])}
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _replace_somewhere(draw, value[i]), *value[i + 1 :]]
    return draw(json_values)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


# -- specification JSON -----------------------------------------------------------------

SPEC_DOCUMENT = json.loads((GOLDEN / "spec.v1.json").read_bytes())


@given(
    st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
        hostile_texts.map(
            lambda t: f'{{"workflow_id": "w", "version": 1, "nodes": [{{"id": "a", "input": {t}}}]}}'.encode()
        ),
        mutated(SPEC_DOCUMENT).map(dumps),
    )
)
def test_spec_json_raises_only_a_located_spec_decode_error(data: bytes) -> None:
    """Any bytes either decode to a spec or raise one-line SpecDecodeError; a decoded spec validates and hashes."""
    try:
        spec = WorkflowSpec.from_json(data)
    except SpecDecodeError as exc:
        assert exc.path.startswith("$") and "\n" not in str(exc)
        assert str(exc).startswith(f"workflow specification JSON is invalid at {exc.path}: ")
        return
    issues = validate(spec)  # never raises, whatever was decoded
    if not issues:
        assert WorkflowSpec.from_json(spec.to_json()).content_hash() == spec.content_hash()


# -- event payloads and journal records ---------------------------------------------------

EVENT_PAYLOADS = {
    path.name.split(".")[0]: path.read_bytes().rstrip(b"\n") for path in (GOLDEN / "events").iterdir()
}

event_types = st.sampled_from(sorted(EVENT_TYPES)) | st.text(max_size=12)


@given(
    event_types,
    st.integers(-3, 5) | st.integers(),
    st.one_of(
        st.binary(max_size=64),
        st.sampled_from(sorted(EVENT_PAYLOADS)).flatmap(
            lambda name: mutated(json.loads(EVENT_PAYLOADS[name])).map(dumps)
        ),
        hostile_texts.map(
            lambda t: EVENT_PAYLOADS["SignalAccepted"].replace(
                b'{"verdict":"approve","by":"alice"}', t.encode()
            )
        ),
    ),
)
def test_event_payloads_raise_only_compatibility_or_corruption_errors(
    event_type: str, version: int, payload: bytes
) -> None:
    """decode_event on any envelope returns an event or raises CompatibilityError or CorruptionError."""
    try:
        event = decode_event(event_type, version, payload)
    except (CompatibilityError, CorruptionError) as exc:
        assert "\n" not in str(exc)
        return
    assert decode_event(event_type, version, encode_event(event).payload) == event


record_fields = st.fixed_dictionaries(
    {
        "run_id": st.sampled_from(["00000000-0000-7000-8000-000000000001"]) | st.text(max_size=40),
        "sequence": st.integers() | st.booleans() | st.text(max_size=3),
        "event_id": st.sampled_from(["00000000-0000-7000-8000-000000000002"]) | st.text(max_size=40),
        "event_type": st.sampled_from(["NodeReady"]) | st.text(max_size=70),
        "schema_version": st.integers() | st.none(),
        "payload": st.binary(max_size=32) | st.text(max_size=8),
        "checksum": st.text(alphabet=string.hexdigits.lower(), max_size=64) | st.integers(),
    }
)


@given(record_fields)
def test_journal_records_raise_only_typed_input_errors(fields: dict[str, Any]) -> None:
    """A record read back from storage with any field values fails verify() only with typed errors."""
    record = JournalRecord(**fields)
    try:
        record.verify()
    except (InvalidRecord, InvalidIdentifier, LimitExceeded, ChecksumMismatch) as exc:
        assert "\n" not in str(exc)


def _snapshot_parts() -> tuple[SnapshotRecord, JournalRecord, Any]:
    run = ReducerHarness(
        WorkflowSpec("fuzz", 1, nodes=(Node("a", handler="a@1"), Node("b", handler="b@1", depends_on=("a",))))
    )
    run.start("a")
    run.complete("a", Succeeded(output={"n": 1}))
    encoded = encode_event(run.history[-1])
    record = JournalRecord.seal(
        run_id=run.state.run_id,
        sequence=run.state.sequence,
        event_id="00000000-0000-7000-8000-0000000000ff",
        event_type=encoded.event_type,
        schema_version=encoded.schema_version,
        payload=encoded.payload,
    )
    snapshot = make_snapshot(run.state, record)
    return snapshot, record, json.loads(snapshot.state)


SNAPSHOT, SNAPSHOT_RECORD, SNAPSHOT_STATE = _snapshot_parts()


@example(b'{"\\n": null}')  # an unknown field named by a raw newline, found by this fuzzer
@settings(max_examples=300)
@given(
    st.one_of(
        mutated(SNAPSHOT_STATE).map(dumps),
        st.binary(max_size=64),
        hostile_texts.map(
            lambda t: dumps({**SNAPSHOT_STATE, "input": 0}).replace(b'"input": 0', b'"input": ' + t.encode())
        ),
    )
)
def test_a_snapshot_with_any_state_bytes_is_restored_or_discarded_never_raised(state: bytes) -> None:
    """restore_snapshot returns a state or a one-line diagnostic for any state bytes with a valid checksum."""
    snapshot = msgspec.structs.replace(SNAPSHOT, state=state, state_checksum="sha256:" + sha256_hex(state))
    restored = restore_snapshot(snapshot, SNAPSHOT_RECORD)
    if isinstance(restored, str):
        assert "\n" not in restored


# -- signal delivery ------------------------------------------------------------------------


def _gate(req: HandlerRequest) -> Any:
    if req.signal is None:
        return WaitForSignal("go", SignalToken(TOKEN))
    return Succeeded(output=req.signal.decision)


class Parked:
    """A run parked on a signal wait, in its own journal."""

    def __init__(self, root: Path) -> None:
        url = f"file://{root}/journal?durability=write"
        registry = HandlerRegistry()
        registry.register("gate", 1, _gate, cooperative=True)
        self.journal = LocalWorkflowJournal(url)
        self.leases = LocalLeaseStore(url)
        self.runtime = WorkflowRuntime(self.journal, registry, leases=self.leases)
        spec = WorkflowSpec(
            "fuzz.gate", 1, nodes=(Node("a", handler="gate@1", retry=RetryPolicy(max_attempts=1)),)
        )
        self.run_id = self.runtime.execute(spec).run_id

    def history(self) -> tuple[int, list[JournalRecord]]:
        return self.journal.next_sequence(self.run_id), self.journal.read(self.run_id)


@pytest.fixture(scope="module")
def parked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Parked]:
    run = Parked(tmp_path_factory.mktemp("signal-fuzz"))
    yield run
    run.journal.close()
    run.leases.close()


tokens = st.text(max_size=40) | st.sampled_from(
    ["x" * 15, "x" * 1025, "has a space in it!!", "tab\there-0123456789"]
)
decisions = json_values | st.sampled_from(
    [float("nan"), 10**5000, {1: "int key"}, object(), json.loads(nested(900))]
)


@settings(max_examples=150)
@given(
    run=st.sampled_from(["parked", "00000000-0000-7000-8000-00000000dead", "not-a-run-id", ""]),
    node=st.sampled_from(["a", "b", "", "A"]) | st.text(max_size=10),
    token=tokens,
    decision=decisions,
    signal_id=st.none() | st.sampled_from(["00000000-0000-7000-8000-0000000000aa"]) | st.text(max_size=10),
    name=st.none() | st.sampled_from(["go", "other"]),
)
def test_signal_delivery_raises_only_typed_rejections_and_rejected_input_changes_nothing(
    parked: Parked, run: str, node: str, token: str, decision: Any, signal_id: str | None, name: str | None
) -> None:
    """A malformed or misaddressed signal is a typed error and writes nothing; only a wrong token is recorded."""
    assume(token != TOKEN)  # the run stays parked for the next example
    run_id = parked.run_id if run == "parked" else run
    before = parked.history()
    try:
        disposition = parked.runtime.signal(run_id, node, token, decision, signal_id=signal_id, name=name)
    except CommandRejected as exc:
        assert exc.rejection.code in (RejectionCode.INVALID_INPUT, RejectionCode.UNKNOWN_NODE)  # type: ignore[attr-defined]
        assert "\n" not in str(exc)
    except (RunNotFound, InvalidIdentifier) as exc:
        assert run != "parked" and "\n" not in str(exc)
    else:
        # A well-formed delivery with the wrong token or name is a fact: recorded (after the run's
        # time is caught up with the wall clock), consuming its id; history before it is untouched.
        assert disposition.status in ("rejected", "already_consumed")
        if disposition.status == "rejected":
            after = parked.history()
            assert after[1][: len(before[1])] == before[1] and after[0] == len(after[1]) + 1
            assert [r.event_type for r in after[1][len(before[1]) :]][-1] == "SignalRejected"
            assert {r.event_type for r in after[1][len(before[1]) : -1]} <= {"VirtualTimeAdvanced"}
            return
    assert parked.history() == before


# -- CLI JSON arguments ----------------------------------------------------------------------

HANDLERS = f"""
from mayfly import HandlerRegistry, Succeeded
from mayfly.model.signals import SignalToken
from mayfly.runtime import WaitForSignal

registry = HandlerRegistry()

@registry.handler("ok")
def ok(req):
    return Succeeded(output=req.run_input)

@registry.handler("gate", cooperative=True)
def gate(req):
    if req.signal is None:
        return WaitForSignal("go", SignalToken({TOKEN!r}))
    return Succeeded(output=req.signal.decision)
"""


class Cli:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = f"file://{root}/journal?durability=write"
        self.handlers = str(root / "handlers.py")
        (root / "handlers.py").write_text(HANDLERS)
        for name in ("ok", "gate"):
            nodes = [{"id": "a", "handler": f"{name}@1", "retry": {"max_attempts": 1}}]
            (root / f"{name}.json").write_text(
                json.dumps({"workflow_id": "fuzz.cli", "version": 1, "nodes": nodes})
            )

    def __call__(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--journal", self.journal, *args], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    def runs(self) -> list[str]:
        if not (self.root / "journal").exists():
            return []
        with LocalWorkflowJournal(self.journal) as journal:
            return journal.list_runs(limit=100_000)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(tmp_path_factory.mktemp("cli-fuzz"))


json_arguments = st.one_of(hostile_texts, st.text(max_size=30), json_values.map(json.dumps))


@settings(max_examples=60)
@given(json_arguments)
def test_cli_json_input_is_accepted_or_a_one_line_usage_error_that_creates_no_run(
    cli: Cli, text: str
) -> None:
    """`mayfly run --input TEXT` either runs or exits 2 with one line, and a refused input creates no run."""
    assume("\x00" not in text)  # an argv entry cannot hold NUL
    before = cli.runs()
    code, _, err = cli("run", str(cli.root / "ok.json"), "--handlers", cli.handlers, f"--input={text}")
    if code == 2:
        assert err.startswith("mayfly: error: --input") and err.count("\n") == 1, err
        assert cli.runs() == before
    else:
        assert code == 0, err
        assert len(cli.runs()) == len(before) + 1


@settings(max_examples=60)
@given(json_arguments)
def test_cli_json_decision_is_delivered_or_a_one_line_usage_error_that_writes_nothing(
    cli: Cli, text: str
) -> None:
    """`mayfly signal --decision TEXT` is accepted or exits 2 with one line, and a refused one writes nothing."""
    assume("\x00" not in text)
    code, out, err = cli("--json", "run", str(cli.root / "gate.json"), "--handlers", cli.handlers)
    assert code == 6, err
    run_id = json.loads(out)["run_id"]
    with LocalWorkflowJournal(cli.journal) as journal:
        before = journal.read(run_id)
        code, _, err = cli("signal", run_id, "a", "--token", TOKEN, f"--decision={text}")
        if code == 2:
            assert err.startswith("mayfly: error: ") and err.count("\n") == 1, err
            assert journal.read(run_id) == before
        else:
            assert code == 0, err
            assert journal.read(run_id)[-1].event_type == "SignalAccepted"
