"""PAL projection, causal keys, closed-type metrics, hook publication and the JSON-lines exporter."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from inspect_runs import (
    DECISION_CANARY,
    NODE_INPUT_CANARY,
    OUTPUT_CANARY,
    PAYLOAD_CANARIES,
    RUN_INPUT_CANARY,
    SCRIPTS,
    SIGNAL_TOKEN,
    persist,
    run_review,
    run_until_approval,
    scripted_run,
)

from mayfly import (
    FixedBackoff,
    Node,
    NodeOutcomeKind,
    NodeStatus,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    WorkflowSpec,
)
from mayfly.hookspecs import PLUGIN_API, hookimpl
from mayfly.journal import JournalRecord
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import FailureCause
from mayfly.model.state import RunState
from mayfly.plugins import PluginManager
from mayfly.recovery import replay_run
from mayfly.reducer import decode_event, replay
from mayfly.telemetry import (
    LATENCY_BUCKET_BOUNDS_MS,
    Counter,
    FailureClass,
    JsonLogExporter,
    LatencyBucket,
    Metric,
    MetricKey,
    MetricsCollector,
    MetricsSnapshot,
    PalFact,
    PalProjector,
    RecoveryMode,
    causal_key,
    compute_metrics,
    project_pal,
    publish_metrics,
    recovery_fact,
)
from mayfly.testing import ReducerHarness

RUN = "0193a5c4-7b1e-7c3d-9f00-1234567890ab"
ATTEMPT = "0193a5c4-7b1e-7c3d-9f00-0000000000a1"


def test_causal_key_matches_its_published_test_vectors() -> None:
    """The causal key is the first 32 hex digits of sha256(run 0x1F node 0x1F attempt), as documented."""
    assert causal_key(RUN, "review", ATTEMPT) == "90a09203efa0c3eb53fd98958c77ac36"
    assert causal_key(RUN, "review") == "f64de828841883f3ba32b01f80c611bd"
    assert causal_key(RUN) == "6c38c23b2b11fd585daa144439468b30"
    expected = hashlib.sha256(f"{RUN}\x1freview\x1f{ATTEMPT}".encode()).hexdigest()[:32]
    assert causal_key(RUN, "review", ATTEMPT) == expected


def test_pal_has_one_fact_per_record_with_its_sequence_event_id_and_scope(tmp_path: Path) -> None:
    """Each acknowledged record yields one fact carrying its sequence, event id, type and causal key."""
    run = run_review(tmp_path)
    records = run.records()
    facts = project_pal(records)
    assert [(f.sequence, f.event_id, f.event_type) for f in facts] == [
        (r.sequence, r.event_id, r.event_type) for r in records
    ]
    for fact in facts:
        assert fact.kind == "record" and fact.run_id == run.run_id
        assert fact.causal_key == causal_key(fact.run_id, fact.node_id, fact.attempt_id)
    started = [f for f in facts if f.event_type == "NodeStarted"]
    outcomes = [f for f in facts if f.event_type == "NodeOutcomeCommitted"]
    # An attempt's dispatch and its outcome share one causal key.
    assert [f.causal_key for f in started] == [f.causal_key for f in outcomes]


def test_pal_reports_status_transitions_outcome_classes_and_virtual_time(tmp_path: Path) -> None:
    """Facts say which node moved from which status to which, with the outcome class and time."""
    run = run_review(tmp_path)
    facts = project_pal(run.records())
    qa = [
        (f.event_type, f.attempt, f.outcome, f.node_from, f.node_to, f.at) for f in facts if f.node_id == "qa"
    ]
    assert qa == [
        ("NodeReady", None, None, NodeStatus.PENDING, NodeStatus.READY, 0),
        ("NodeStarted", 1, None, NodeStatus.READY, NodeStatus.RUNNING, 0),
        (
            "NodeOutcomeCommitted",
            1,
            NodeOutcomeKind.RETRYABLE_FAILURE,
            NodeStatus.RUNNING,
            NodeStatus.RETRY_PENDING,
            0,
        ),
        ("RetryScheduled", 2, None, NodeStatus.RETRY_PENDING, NodeStatus.RETRY_PENDING, 0),
        ("RetryReleased", 2, None, NodeStatus.RETRY_PENDING, NodeStatus.READY, 1_500),
        ("NodeStarted", 2, None, NodeStatus.READY, NodeStatus.RUNNING, 1_500),
        (
            "NodeOutcomeCommitted",
            2,
            NodeOutcomeKind.SUCCEEDED,
            NodeStatus.RUNNING,
            NodeStatus.SUCCEEDED,
            1_500,
        ),
    ]
    edge = next(f for f in facts if f.event_type == "EdgeActivated")
    assert (edge.node_id, edge.node_from, edge.node_to) == ("review", NodeStatus.PENDING, NodeStatus.READY)
    assert (facts[-1].event_type, facts[-1].run_status) == ("RunCompleted", RunStatus.SUCCEEDED)
    assert facts[-2].run_status is RunStatus.RUNNING


def test_pal_facts_are_payload_free(tmp_path: Path) -> None:
    """No encoded PAL fact contains an input, output or token canary."""
    run = run_review(tmp_path)
    data = b"\n".join(msgspec.json.encode(f) for f in project_pal(run.records()))
    assert data
    for canary in PAYLOAD_CANARIES:
        assert canary.encode() not in data


def state_after(records: list[JournalRecord]) -> RunState:
    """The run state after ``records`` (which start at sequence 1)."""
    return replay([decode_event(r.event_type, r.schema_version, r.payload) for r in records])


def test_signal_waits_project_their_transitions_without_token_or_decision(tmp_path: Path) -> None:
    """A wait and its accepted signal are facts of the attempt's scope; neither token nor decision shows."""
    run = run_until_approval(tmp_path)
    run.runtime.signal(run.run_id, "approval", SIGNAL_TOKEN, {"note": DECISION_CANARY})
    assert run.runtime.resume(run.run_id).succeeded
    facts = project_pal(run.records())
    approval = [(f.event_type, f.attempt, f.node_from, f.node_to) for f in facts if f.node_id == "approval"]
    assert approval[2:] == [
        ("SignalWaitOpened", 1, NodeStatus.RUNNING, NodeStatus.WAITING),
        ("SignalAccepted", 1, NodeStatus.WAITING, NodeStatus.RUNNING),
        ("NodeOutcomeCommitted", 1, NodeStatus.RUNNING, NodeStatus.SUCCEEDED),
    ]
    started = next(f for f in facts if f.event_type == "NodeStarted" and f.node_id == "approval")
    accepted = next(f for f in facts if f.event_type == "SignalAccepted")
    assert accepted.causal_key == started.causal_key
    data = b"".join(msgspec.json.encode(f) for f in facts)
    for canary in PAYLOAD_CANARIES:
        assert canary.encode() not in data
    snapshot = compute_metrics([run.recovered()], {run.run_id: run.records()})
    for canary in PAYLOAD_CANARIES:
        assert canary.encode() not in snapshot.to_json()


def test_incremental_projection_equals_whole_projection(tmp_path: Path) -> None:
    """Projecting in two parts with one projector gives exactly the facts of one projection."""
    records = run_review(tmp_path).records()
    projector = PalProjector()
    assert projector.project(records[:10]) + projector.project(records[10:]) == project_pal(records)


def test_a_projector_started_from_a_state_continues_it_without_changing_it(tmp_path: Path) -> None:
    """From a state, projection continues at its next sequence and leaves the given state untouched."""
    records = run_review(tmp_path).records()
    midway = state_after(records[:10])
    before = msgspec.json.encode(midway.to_record())
    assert PalProjector(midway).project(records[10:]) == project_pal(records)[10:]
    assert msgspec.json.encode(midway.to_record()) == before


def test_out_of_order_or_foreign_records_are_refused(tmp_path: Path) -> None:
    """A projection must start at the next sequence of its run; anything else raises InvalidRecord."""
    records = run_review(tmp_path / "a").records()
    other = run_review(tmp_path / "b", namespace=4).records()
    with pytest.raises(InvalidRecord, match="expected sequence 1"):
        project_pal(records[1:])
    with pytest.raises(InvalidRecord, match="expected sequence 11"):
        PalProjector(state_after(records[:10])).project(records[11:])
    with pytest.raises(InvalidRecord, match="got run"):
        PalProjector(state_after(records[:10])).project(other[10:])


def test_pal_is_not_fed_back_into_reduction(tmp_path: Path) -> None:
    """Projecting PAL changes nothing in the journal: replay gives the same state before and after."""
    run = run_review(tmp_path)
    before = msgspec.json.encode(replay_run(run.journal, run.run_id).state.to_record())
    project_pal(run.records())
    after = msgspec.json.encode(replay_run(run.journal, run.run_id).state.to_record())
    assert before == after
    assert len(run.records()) == 28


def test_a_recovery_operation_is_a_pal_fact_scoped_to_the_run(tmp_path: Path) -> None:
    """recovery_fact records the mode and the last record read, keyed by the run scope."""
    run = run_review(tmp_path)
    recovered = run.recovered()
    fact = recovery_fact(recovered, RecoveryMode.RESUME)
    assert (fact.kind, fact.event_type, fact.recovery_mode) == ("recovery", "Recovery", RecoveryMode.RESUME)
    assert (fact.sequence, fact.event_id) == (28, recovered.last_record.event_id)
    assert fact.causal_key == causal_key(run.run_id)
    assert msgspec.json.decode(msgspec.json.encode(fact), type=PalFact) == fact


def test_metrics_count_runs_nodes_outcomes_latency_and_recoveries(tmp_path: Path) -> None:
    """A finished run's snapshot counts its state, node states, attempt outcomes and latency buckets."""
    run = run_review(tmp_path)
    collector = MetricsCollector()
    collector.add_run(run.recovered().state, run.records())
    collector.add_recovery(RecoveryMode.INSPECT)
    snapshot = collector.snapshot()
    ok = RunStatus.SUCCEEDED
    assert snapshot.runs_observed == 1
    assert snapshot.value(MetricKey(Metric.RUNS, run_state=ok)) == 1
    assert snapshot.value(MetricKey(Metric.NODES, run_state=ok, node_state=NodeStatus.SUCCEEDED)) == 5
    outcomes = {c.key.outcome_class: c.value for c in snapshot.series(Metric.ATTEMPT_OUTCOMES)}
    assert outcomes == {
        NodeOutcomeKind.SUCCEEDED: 6,
        NodeOutcomeKind.CHANGES_REQUESTED: 1,
        NodeOutcomeKind.RETRYABLE_FAILURE: 1,
    }
    assert snapshot.total(Metric.ATTEMPT_LATENCY) == 8
    assert (
        snapshot.value(MetricKey(Metric.RUN_DURATION, run_state=ok, latency_bucket=LatencyBucket.LE_10S)) == 1
    )
    assert snapshot.value(MetricKey(Metric.RECOVERIES, recovery_mode=RecoveryMode.INSPECT)) == 1
    keys = [c.key.sort_key() for c in snapshot.counters]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_failed_nodes_are_counted_by_failure_class(tmp_path: Path) -> None:
    """Retries exhausted and a permanent failure land in their own failure classes."""
    spec = WorkflowSpec(
        workflow_id="ops.fail",
        version=1,
        nodes=(
            Node("a", handler="a@1", retry=RetryPolicy(max_attempts=1, backoff=FixedBackoff(delay_ms=1))),
            Node("b", handler="b@1"),
        ),
    )
    harness = ReducerHarness(spec)
    harness.run_script({"a": [RetryableFailure(reason="x")], "b": [PermanentFailure(reason="y")]})
    snapshot = compute_metrics([persist(harness, tmp_path).recovered()])
    failures = {c.key.failure_class: c.value for c in snapshot.series(Metric.NODE_FAILURES)}
    assert failures == {FailureClass.RETRIES_EXHAUSTED: 1, FailureClass.PERMANENT_FAILURE: 1}
    assert FailureClass.of(FailureCause.NO_CORRECTION_EDGE, None) is FailureClass.NO_CORRECTION_EDGE
    assert FailureClass.of(None, NodeOutcomeKind.CANCELLED) is FailureClass.OTHER


def test_an_id_can_never_become_a_metric_label(tmp_path: Path) -> None:
    """A string where an enum label belongs is a TypeError; an id in JSON is a ValidationError."""
    run = run_review(tmp_path)
    with pytest.raises(TypeError, match="node_state must be a NodeStatus"):
        MetricKey(Metric.NODES, run_state=RunStatus.RUNNING, node_state="review")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_state must be a RunStatus"):
        MetricKey(Metric.RUNS, run_state=run.run_id)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_state must be a RunStatus"):
        MetricKey(Metric.RUNS, run_state="succeeded")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metric must be a Metric"):
        MetricKey("runs", run_state=RunStatus.RUNNING)  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps({"metric": "runs", "run_state": run.run_id}).encode(), type=MetricKey)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"metric":"runs","run_state":"running","run_id":"x"}', type=MetricKey)


def test_each_metric_takes_exactly_its_dimensions() -> None:
    """A missing label or a label outside the metric's dimensions is refused."""
    with pytest.raises(ValueError, match="needs a node_state label"):
        MetricKey(Metric.NODES, run_state=RunStatus.RUNNING)
    with pytest.raises(ValueError, match="has no latency_bucket dimension"):
        MetricKey(Metric.RUNS, run_state=RunStatus.RUNNING, latency_bucket=LatencyBucket.LE_1S)
    key = MetricKey(
        Metric.ATTEMPT_LATENCY, outcome_class=NodeOutcomeKind.BLOCKED, latency_bucket=LatencyBucket.GT_1H
    )
    assert key.labels() == {"outcome_class": "blocked", "latency_bucket": "gt_1h"}


def test_a_snapshot_holds_each_series_once_in_key_order() -> None:
    """Duplicate, unordered or negative series are refused when a snapshot is built or decoded."""
    running = MetricKey(Metric.RUNS, run_state=RunStatus.RUNNING)
    failed = MetricKey(Metric.RUNS, run_state=RunStatus.FAILED)
    ok = MetricsSnapshot(1, 2, (Counter(failed, 1), Counter(running, 1)))
    assert msgspec.json.decode(ok.to_json(), type=MetricsSnapshot) == ok
    for counters in (
        (Counter(running, 1), Counter(failed, 1)),
        (Counter(running, 1), Counter(running, 1)),
        (Counter(running, -1),),
    ):
        with pytest.raises(ValueError, match="metrics snapshot series"):
            MetricsSnapshot(1, 2, counters)
    bad = ok.to_json().replace(b'"value":1}]', b'"value":-1}]')
    with pytest.raises(msgspec.ValidationError, match="negative"):
        msgspec.json.decode(bad, type=MetricsSnapshot)


def test_latency_buckets_have_fixed_inclusive_bounds() -> None:
    """Each bucket holds durations up to its bound; above one hour is gt_1h; negatives are refused."""
    assert LATENCY_BUCKET_BOUNDS_MS == (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
    assert [LatencyBucket.of(ms) for ms in (0, 10, 11, 1_000, 1_001, 3_600_000, 3_600_001)] == [
        LatencyBucket.LE_10MS,
        LatencyBucket.LE_10MS,
        LatencyBucket.LE_100MS,
        LatencyBucket.LE_1S,
        LatencyBucket.LE_10S,
        LatencyBucket.LE_1H,
        LatencyBucket.GT_1H,
    ]
    assert [b.upper_bound_ms for b in LatencyBucket] == [*LATENCY_BUCKET_BOUNDS_MS, None]
    with pytest.raises(ValueError, match=">= 0"):
        LatencyBucket.of(-1)


class Recorder:
    """A metrics exporter plugin that keeps what it receives."""

    MAYFLY_PLUGIN_API = PLUGIN_API

    def __init__(self) -> None:
        self.received: list[object] = []

    @hookimpl
    def mayfly_publish_metrics(self, snapshot: object) -> None:
        self.received.append(snapshot)


@pytest.fixture
def log_stream() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A real logger writing bare messages to a string buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("mayfly.test.telemetry")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def test_publishing_hands_every_exporter_the_same_complete_snapshot(
    tmp_path: Path, log_stream: tuple[logging.Logger, io.StringIO]
) -> None:
    """Through the plugin manager's hook, each exporter gets the whole snapshot once, as one log line."""
    logger, stream = log_stream
    manager = PluginManager(load_entry_points=False, environ={})
    first, second = Recorder(), Recorder()
    manager.register(first, name="first", distribution="test")
    manager.register(second, name="second", distribution="test")
    manager.register(JsonLogExporter(logger), name="jsonlog", distribution="mayfly")
    run = run_review(tmp_path)
    snapshot = compute_metrics([run.recovered()], {run.run_id: run.records()})
    publish_metrics(snapshot, manager)
    assert first.received == [snapshot] and first.received[0] is snapshot
    assert second.received == [snapshot]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["event"] == "mayfly.metrics"
    assert msgspec.convert(line["snapshot"], type=MetricsSnapshot) == snapshot
    with pytest.raises(TypeError, match="MetricsSnapshot"):
        publish_metrics({"runs": 1}, manager)  # type: ignore[arg-type]


def test_publishing_without_a_publisher_goes_to_the_process_plugin_manager() -> None:
    """publish_metrics(snapshot) with no context reaches the exporters of mayfly.plugins.plugin_manager()."""
    probe = textwrap.dedent(
        """
        from mayfly.hookspecs import hookimpl
        from mayfly.plugins import plugin_manager
        from mayfly.telemetry import MetricsCollector, publish_metrics

        class Recorder:
            MAYFLY_PLUGIN_API = 1
            received = []

            @hookimpl
            def mayfly_publish_metrics(self, snapshot):
                self.received.append(snapshot)

        recorder = Recorder()
        plugin_manager().register(recorder, name="recorder", distribution="test")
        snapshot = MetricsCollector().snapshot()
        publish_metrics(snapshot)
        assert recorder.received == [snapshot], recorder.received
        print("published")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "published"), done.stderr


def test_metrics_and_log_lines_hold_no_ids_or_payloads(
    tmp_path: Path, log_stream: tuple[logging.Logger, io.StringIO]
) -> None:
    """Snapshot JSON and log lines contain no run, attempt, event or workflow id and no payload canary."""
    logger, stream = log_stream
    run = run_review(tmp_path)
    records = run.records()
    snapshot = compute_metrics([run.recovered()], {run.run_id: records})
    exporter = JsonLogExporter(logger, logger)
    exporter.export_metrics(snapshot)
    metrics_bytes = snapshot.to_json() + stream.getvalue().encode()
    forbidden = {run.run_id, "demo.review", "review@1", *(r.event_id for r in records)}
    forbidden |= {a.attempt_id for a in run.recovered().state.to_record().attempts}
    for text in (*forbidden, *PAYLOAD_CANARIES):
        assert text.encode() not in metrics_bytes, text
    exporter.export_pal(project_pal(records))
    pal_lines = stream.getvalue().splitlines()[1:]
    assert len(pal_lines) == len(records)
    assert all(json.loads(line)["event"] == "mayfly.pal" for line in pal_lines)
    for canary in (RUN_INPUT_CANARY, NODE_INPUT_CANARY, OUTPUT_CANARY):
        assert canary not in stream.getvalue()


def test_every_dimension_is_a_closed_enum() -> None:
    """MetricKey labels are typed only by enums: run/node state, failure, outcome, recovery, latency."""
    annotations = MetricKey.__annotations__
    assert set(annotations) == {
        "metric",
        "run_state",
        "node_state",
        "failure_class",
        "outcome_class",
        "recovery_mode",
        "latency_bucket",
    }
    assert all("str" not in str(a) for a in annotations.values())


@settings(max_examples=60, deadline=None)
@given(script=SCRIPTS)
def test_any_scripted_run_projects_consistent_payload_free_pal_and_metrics(
    script: dict[str, list[int]],
) -> None:
    """For any outcome script: one fact per record ending in each node's final status; metrics add up."""
    recovered, records = scripted_run(script)
    state = recovered.state
    facts = project_pal(records)
    assert [f.sequence for f in facts] == [r.sequence for r in records]
    final = {f.node_id: f.node_to for f in facts if f.node_id is not None}
    assert final == {n.node_id: n.status for n in state.nodes if n.node_id in final}
    assert facts[-1].run_status is state.status
    snapshot = compute_metrics([recovered], {state.run_id: records})
    assert snapshot.total(Metric.RUNS) == 1
    assert snapshot.total(Metric.NODES) == len(state.nodes)
    closed = [a for a in state.to_record().attempts if a.outcome is not None]
    assert snapshot.total(Metric.ATTEMPT_OUTCOMES) == len(closed) == snapshot.total(Metric.ATTEMPT_LATENCY)
    assert snapshot.total(Metric.NODE_FAILURES) == sum(n.status is NodeStatus.FAILED for n in state.nodes)
    data = snapshot.to_json() + b"".join(msgspec.json.encode(f) for f in facts)
    for canary in PAYLOAD_CANARIES:
        assert canary.encode() not in data
