"""RunInspection: payload-free node, attempt and blocking summaries, capped history, renderers."""

from __future__ import annotations

import inspect as pyinspect
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_runs import (
    DECISION_CANARY,
    NODE_INPUT_CANARY,
    OUTPUT_CANARY,
    PAYLOAD_CANARIES,
    QA_REASON,
    REVIEW_REASON,
    RUN_INPUT_CANARY,
    SCRIPTS,
    SIGNAL_TOKEN,
    Completed,
    persist,
    run_review,
    run_until_approval,
    scripted_run,
)

from mayfly import (
    ChildCall,
    ChildDefinition,
    Edge,
    FixedBackoff,
    Node,
    NodeOutcomeKind,
    NodeStatus,
    OnField,
    OnOutcome,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    RunBudgets,
    Succeeded,
    WorkflowSpec,
)
from mayfly.commit import seal_events
from mayfly.inspect import (
    DEFAULT_HISTORY_LIMIT,
    INSPECTION_SCHEMA_VERSION,
    RunInspection,
    build_inspection,
    from_json,
    history_line,
    narrate,
    render_mermaid,
    render_table,
    to_json,
)
from mayfly.journal import JournalRecord
from mayfly.model.commands import AttemptStart, CompleteChild, StartNodes
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import EVENT_TYPES, FailureCause, NodeReady
from mayfly.testing import DeterministicIdSource, ReducerHarness

FAIL_REASON = "schema drift REASON-FAIL-31"
CANCEL_REASON = "operator stop REASON-CANCEL-9"


def outputs(inspection: RunInspection, spec: WorkflowSpec) -> dict[str, bytes]:
    """Every rendering of an inspection, as bytes."""
    return {
        "table": render_table(inspection).encode(),
        "json": to_json(inspection),
        "mermaid": render_mermaid(inspection, spec).encode(),
    }


def assert_payload_free(inspection: RunInspection, spec: WorkflowSpec) -> None:
    """No rendering of ``inspection`` contains an input, output or token canary."""
    for name, data in outputs(inspection, spec).items():
        for canary in PAYLOAD_CANARIES:
            assert canary.encode() not in data, f"{canary} leaked into the {name} rendering"


def harness_records(harness: ReducerHarness) -> list[JournalRecord]:
    """A harness's history as sealed records (the same ids ``persist`` gives them)."""
    return seal_events(harness.run_id, 1, harness.history, DeterministicIdSource(namespace=11))


def in_flight(tmp_path: Path) -> Completed:
    """A run stopped mid-flight: a retry pending, an attempt running, a node ready, others pending."""
    spec = WorkflowSpec(
        workflow_id="ops.flight",
        version=1,
        nodes=(
            Node(
                "fetch",
                handler="fetch@1",
                input={"secret": NODE_INPUT_CANARY},
                retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=500)),
            ),
            Node("lint", handler="lint@1"),
            Node("idle", handler="idle@1"),
            Node("merge", handler="merge@1", depends_on=("fetch", "lint")),
            Node("fixup", handler="fixup@1"),
        ),
        edges=(Edge("lint", "fixup", when=OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)),),
    )
    harness = ReducerHarness(spec, input={"ticket": RUN_INPUT_CANARY})
    harness.start("fetch", "lint")
    harness.complete("fetch", RetryableFailure(reason=QA_REASON))
    harness.advance(200)
    return persist(harness, tmp_path)


def test_a_finished_run_lists_nodes_in_spec_order_with_attempt_counts(tmp_path: Path) -> None:
    """Node summaries follow the spec order and count attempts per activation and per run."""
    run = run_review(tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    assert inspection.schema_version == INSPECTION_SCHEMA_VERSION
    assert (inspection.status, inspection.result) == ("succeeded", "succeeded")
    assert [(n.node_id, n.status, n.attempt, n.total_attempts, n.outcome) for n in inspection.nodes] == [
        ("plan", NodeStatus.SUCCEEDED, 1, 1, NodeOutcomeKind.SUCCEEDED),
        ("implement", NodeStatus.SUCCEEDED, 1, 2, NodeOutcomeKind.SUCCEEDED),
        ("review", NodeStatus.SUCCEEDED, 1, 2, NodeOutcomeKind.SUCCEEDED),
        ("qa", NodeStatus.SUCCEEDED, 2, 2, NodeOutcomeKind.SUCCEEDED),
        ("publish", NodeStatus.SUCCEEDED, 1, 1, NodeOutcomeKind.SUCCEEDED),
    ]
    assert [n.handler for n in inspection.nodes] == ["plan@1", "implement@1", "review@1", "qa@1", "publish@1"]
    assert inspection.blocking == ()
    assert (inspection.workflow_id, inspection.workflow_version) == ("demo.review", 1)
    assert inspection.spec_hash == run.spec.content_hash()
    assert inspection.budgets.attempts_used == 8 and inspection.budgets.attempts_limit == 10_000
    assert inspection.now == 1_500 and inspection.sequence == len(run.records())


def test_every_consumed_attempt_is_summarized_with_its_outcome_class_and_reason(tmp_path: Path) -> None:
    """Attempt summaries list every attempt id with its node, outcome kind, number, timing and reason."""
    run = run_review(tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    rows = [(a.node_id, a.attempt, a.outcome, a.reason) for a in inspection.attempts]
    assert rows == [
        ("plan", 1, NodeOutcomeKind.SUCCEEDED, ""),
        ("implement", 1, NodeOutcomeKind.SUCCEEDED, ""),
        ("review", 1, NodeOutcomeKind.CHANGES_REQUESTED, REVIEW_REASON),
        ("implement", 1, NodeOutcomeKind.SUCCEEDED, ""),
        ("review", 1, NodeOutcomeKind.SUCCEEDED, ""),
        ("qa", 1, NodeOutcomeKind.RETRYABLE_FAILURE, QA_REASON),
        ("qa", 2, NodeOutcomeKind.SUCCEEDED, ""),
        ("publish", 1, NodeOutcomeKind.SUCCEEDED, ""),
    ]
    assert len({a.attempt_id for a in inspection.attempts}) == inspection.budgets.attempts_used
    qa_retry = inspection.attempts[6]
    assert (qa_retry.started_at, qa_retry.finished_at) == (1_500, 1_500)


def test_no_rendering_contains_inputs_outputs_or_tokens_but_reasons_appear(tmp_path: Path) -> None:
    """Table, JSON and Mermaid carry no input/output/token canary, while the bounded reasons show."""
    run = run_review(tmp_path)
    journal_bytes = b"".join(r.payload for r in run.records())
    for canary in (RUN_INPUT_CANARY, NODE_INPUT_CANARY, OUTPUT_CANARY):
        assert canary.encode() in journal_bytes  # the canaries really are in the history
    inspection = build_inspection(run.recovered(), run.records(), journal_url=run.journal.url)
    assert_payload_free(inspection, run.spec)
    rendered = outputs(inspection, run.spec)
    for reason in (REVIEW_REASON, QA_REASON):
        assert reason.encode() in rendered["table"]
        assert reason.encode() in rendered["json"]


def test_an_in_flight_run_says_why_each_open_node_is_not_progressing(tmp_path: Path) -> None:
    """Blocking diagnostics name the retry time, the running attempt, the ready node and the prerequisites."""
    run = in_flight(tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    lint = next(n for n in inspection.nodes if n.node_id == "lint")
    assert lint.active_attempt_id is not None
    assert {d.node_id: d.detail for d in inspection.blocking} == {
        "fetch": "waiting for retry attempt 2 at 500 (in 300 ms)",
        "lint": f"running attempt 1 ({lint.active_attempt_id}) since 0",
        "idle": "ready for attempt 1; waiting to be dispatched",
        "merge": "pending on prerequisites (all_succeeded): fetch (retry_pending), lint (running)",
        "fixup": "pending until a conditional edge from lint fires",
    }
    fetch = inspection.nodes[0]
    assert (fetch.status, fetch.retry_deadline, fetch.reason) == (NodeStatus.RETRY_PENDING, 500, QA_REASON)
    assert inspection.result is None and inspection.now == 200
    assert inspection.status == "running"  # lint runs, idle is ready: not only waiting
    assert_payload_free(inspection, run.spec)


def test_a_waiting_node_names_its_signal_and_deadline_never_its_token_or_decision(tmp_path: Path) -> None:
    """A node parked on a signal shows the wait's name and expiry; token and decision never appear."""
    run = run_until_approval(tmp_path)
    parked = build_inspection(run.recovered(), run.records())
    approval = parked.nodes[1]
    assert (approval.status, approval.waiting_for, approval.wait_deadline) == (
        NodeStatus.WAITING,
        "approval",
        60_000,
    )
    assert {d.node_id: d.detail for d in parked.blocking} == {
        "approval": (
            f"waiting for signal approval on attempt 1 ({approval.active_attempt_id}) since 0, "
            "expires at 60000 (in 60000 ms)"
        ),
        "publish": "pending on prerequisites (all_succeeded): approval (waiting)",
    }
    assert (
        parked.history.lines[-1]
        == "#7 SignalWaitOpened approval waiting for signal 'approval' (until 60000 ms)"
    )
    assert parked.status == "waiting"
    assert_payload_free(parked, run.spec)

    disposition = run.runtime.signal(run.run_id, "approval", SIGNAL_TOKEN, {"note": DECISION_CANARY})
    assert disposition.status == "accepted"
    assert run.runtime.resume(run.run_id).succeeded
    assert DECISION_CANARY.encode() in b"".join(r.payload for r in run.records())  # stored, not shown
    done = build_inspection(run.recovered(), run.records())
    assert "#8 SignalAccepted approval signal 'approval' accepted" in done.history.lines
    assert done.blocking == ()
    assert_payload_free(done, run.spec)


def test_a_child_call_shows_its_child_run_but_not_the_child_input_or_output(tmp_path: Path) -> None:
    """A running child call names its child run; the mapped input and copied output never appear."""
    lint = ChildDefinition(
        workflow_id="acme.lint",
        version=2,
        nodes=(Node("scan", handler="scan@1", outputs=("warnings",)),),
        inputs=("repo",),
        outputs=("warnings",),
    )
    spec = WorkflowSpec(
        workflow_id="acme.ci",
        version=1,
        nodes=(
            Node(
                "lint",
                child=ChildCall("acme.lint", 2, "require_success", inputs=("repo",), outputs=("warnings",)),
            ),
        ),
        catalog=(lint,),
    )
    harness = ReducerHarness(spec, input={"repo": RUN_INPUT_CANARY})
    attempt_id, child_run_id = harness.ids.new_id(), harness.ids.new_id()
    harness.execute(StartNodes((AttemptStart("lint", attempt_id, child_run_id),)))
    running = build_inspection(persist(harness, tmp_path / "running").recovered(), harness_records(harness))
    (node,) = running.nodes
    assert (node.handler, node.status, node.child_run_id) == (
        "child acme.lint@2",
        NodeStatus.RUNNING,
        child_run_id,
    )
    assert running.blocking[0].detail == f"running attempt 1 ({attempt_id}) since 0, child run {child_run_id}"
    assert running.attempts[0].child_run_id == child_run_id
    assert running.status == "running"
    # A run whose only attempt in flight calls a child run that only waits is waiting too.
    waiting_child = run_until_approval(tmp_path / "child").recovered().state
    recovered = persist(harness, tmp_path / "again").recovered()
    assert build_inspection(recovered, children=lambda _: waiting_child).status == "waiting"
    assert build_inspection(recovered, children=lambda _: None).status == "running"
    assert_payload_free(running, spec)
    harness.execute(CompleteChild("lint", attempt_id, child_run_id, "succeeded", {"warnings": OUTPUT_CANARY}))
    run = persist(harness, tmp_path / "done")
    done = build_inspection(run.recovered(), run.records())
    assert done.status == "succeeded"
    assert "#3 ChildStarted lint started attempt 1 as child run of acme.lint@2" in done.history.lines
    assert "#4 ChildCompleted lint child run succeeded" in done.history.lines
    assert_payload_free(done, spec)


def test_terminal_non_success_nodes_carry_their_reason_and_failure_cause(tmp_path: Path) -> None:
    """A permanently failed node shows its reason; dependents show why they were skipped."""
    spec = WorkflowSpec(
        workflow_id="ops.fail",
        version=1,
        nodes=(
            Node(
                "build",
                handler="build@1",
                retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(delay_ms=10)),
            ),
            Node("ship", handler="ship@1", depends_on=("build",)),
        ),
    )
    harness = ReducerHarness(spec)
    harness.run_script({"build": [RetryableFailure(reason=QA_REASON), RetryableFailure(reason=FAIL_REASON)]})
    run = persist(harness, tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    build, ship = inspection.nodes
    assert (build.status, build.failure, build.reason) == (
        NodeStatus.FAILED,
        FailureCause.RETRIES_EXHAUSTED,
        FAIL_REASON,
    )
    assert build.failure_detail == "2 of 2 attempts used"
    assert ship.status is NodeStatus.SKIPPED
    details = {d.node_id: d.detail for d in inspection.blocking}
    assert details["build"] == f"failed: retryable_failure (retries_exhausted): {FAIL_REASON}"
    assert details["ship"] == "skipped: prerequisites did not succeed (all_succeeded cannot be met)"
    assert FAIL_REASON in render_table(inspection)


def test_a_permanent_failure_needs_no_failure_cause(tmp_path: Path) -> None:
    """A node failed by its own PermanentFailure reports the outcome and its reason."""
    spec = WorkflowSpec(workflow_id="ops.perm", version=1, nodes=(Node("build", handler="build@1"),))
    harness = ReducerHarness(spec)
    harness.run_script({"build": [PermanentFailure(reason=FAIL_REASON)]})
    inspection = build_inspection(persist(harness, tmp_path).recovered())
    (build,) = inspection.nodes
    assert (build.status, build.outcome, build.reason) == (
        NodeStatus.FAILED,
        NodeOutcomeKind.PERMANENT_FAILURE,
        FAIL_REASON,
    )
    assert inspection.blocking[0].detail == f"failed: permanent_failure: {FAIL_REASON}"


def test_cancellation_shows_requester_bounded_reason_and_time(tmp_path: Path) -> None:
    """A cancelled run reports who cancelled it, why, when and how many attempts were targeted."""
    spec = WorkflowSpec(
        workflow_id="ops.cancel",
        version=1,
        nodes=(Node("a", handler="a@1", input={"k": NODE_INPUT_CANARY}), Node("b", handler="b@1")),
    )
    harness = ReducerHarness(spec, input=RUN_INPUT_CANARY)
    harness.start("a")
    harness.advance(42)
    harness.cancel(reason=CANCEL_REASON, requester="alice")
    run = persist(harness, tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    assert inspection.status == "cancelled"
    assert inspection.cancellation is not None
    c = inspection.cancellation
    assert (c.requester, c.reason, c.at, c.targets) == ("alice", CANCEL_REASON, 42, 1)
    assert CANCEL_REASON in render_table(inspection)
    assert_payload_free(inspection, run.spec)


def test_budget_exhaustion_is_reported_with_limit_and_observed_usage(tmp_path: Path) -> None:
    """A run that ran out of attempts shows the exhausted budget, its limit and the observed usage."""
    spec = WorkflowSpec(
        workflow_id="ops.budget",
        version=1,
        nodes=(Node("a", handler="a@1"), Node("b", handler="b@1")),
        budgets=RunBudgets(max_attempts=1),
    )
    harness = ReducerHarness(spec)
    harness.start("a", "b")
    inspection = build_inspection(persist(harness, tmp_path).recovered())
    exhausted = inspection.budgets.exhausted
    assert exhausted is not None
    assert (exhausted.kind, exhausted.limit, exhausted.observed) == ("run_attempts", 1, 2)
    assert inspection.status == "failed"
    table = render_table(inspection)
    assert "run_attempts: limit 1, observed 2" in table
    assert {d.detail for d in inspection.blocking} == {"cancelled: run budget exhausted (run_attempts)"}


def test_history_keeps_the_most_recent_lines_and_counts_the_rest(tmp_path: Path) -> None:
    """With a cap of 5, the last five events are kept and the others are counted as omitted."""
    run = run_review(tmp_path)
    records = run.records()
    inspection = build_inspection(run.recovered(), records, history_limit=5)
    history = inspection.history
    assert (history.complete, history.retained, history.omitted) == (len(records), 5, len(records) - 5)
    assert [line.split()[0] for line in history.lines] == [f"#{r.sequence}" for r in records[-5:]]
    assert history.lines[-1] == f"#{len(records)} RunCompleted succeeded"
    assert "HISTORY (complete 28, retained 5, omitted 23)" in render_table(inspection)


def test_history_defaults_to_200_lines_and_a_tail_of_records_suffices(tmp_path: Path) -> None:
    """The default cap is 200; passing only the last records still counts the complete history."""
    run = run_review(tmp_path)
    records = run.records()
    full = build_inspection(run.recovered(), records)
    assert DEFAULT_HISTORY_LIMIT == 200
    assert (full.history.retained, full.history.omitted) == (len(records), 0)
    tail = build_inspection(run.recovered(), records[-3:])
    assert tail.history.lines == full.history.lines[-3:]
    assert (tail.history.complete, tail.history.retained, tail.history.omitted) == (28, 3, 25)


def test_without_records_the_history_is_all_omitted_and_timings_unknown(tmp_path: Path) -> None:
    """Built from state alone, the history retains nothing and attempt timings are None."""
    run = run_review(tmp_path)
    inspection = build_inspection(run.recovered())
    assert (inspection.history.retained, inspection.history.omitted) == (0, 28)
    assert all(a.started_at is None and a.attempt is None for a in inspection.attempts)
    assert build_inspection(run.recovered(), run.records(), history_limit=0).history.retained == 0


def test_history_lines_are_payload_free_one_per_event(tmp_path: Path) -> None:
    """Each line names the sequence, event type, node and outcome class only."""
    run = run_review(tmp_path)
    lines = build_inspection(run.recovered(), run.records()).history.lines
    assert lines[0] == "#1 RunCreated created: demo.review@1 (5 nodes)"
    assert "#10 NodeOutcomeCommitted review changes_requested" in lines
    assert "#19 NodeOutcomeCommitted qa retryable_failure" in lines
    assert "#20 RetryScheduled qa retry 2 scheduled in 1500 ms (at 1500 ms)" in lines
    assert history_line(NodeReady(node_id="plan", cause="initial")) == "NodeReady plan ready (initial)"


class FutureEvent(msgspec.Struct, frozen=True):
    """Stands in for an event type added after the inspection code."""

    node_id: str
    secret: str


def test_every_event_type_has_its_own_history_line_and_unknown_ones_stay_payload_free() -> None:
    """The narration names each known event type explicitly; an unknown one shows only its type and node."""
    source = pyinspect.getsource(narrate)
    assert [name for name in EVENT_TYPES if f"isinstance(event, {name})" not in source] == []
    line = history_line(FutureEvent(node_id="plan", secret=OUTPUT_CANARY))  # type: ignore[arg-type]
    assert line == "FutureEvent plan"


def test_an_invalid_history_limit_or_foreign_record_is_refused(tmp_path: Path) -> None:
    """A negative cap raises ValueError; another run's or unordered records raise InvalidRecord."""
    run = run_review(tmp_path)
    other = in_flight(tmp_path / "other")
    with pytest.raises(ValueError, match="history_limit"):
        build_inspection(run.recovered(), run.records(), history_limit=-1)
    with pytest.raises(InvalidRecord, match="record of run"):
        build_inspection(run.recovered(), other.records())
    records = run.records()
    with pytest.raises(InvalidRecord, match="in order"):
        build_inspection(run.recovered(), [records[3], records[2]])


def test_the_journal_url_is_redacted(tmp_path: Path) -> None:
    """A password in the journal URL is replaced by *** before it reaches any output."""
    run = in_flight(tmp_path)
    inspection = build_inspection(run.recovered(), journal_url="postgresql://app:hunter2@db:5432/mayfly")
    assert inspection.journal_url == "postgresql://app:***@db:5432/mayfly"
    assert b"hunter2" not in to_json(inspection)
    assert "hunter2" not in render_table(inspection)


def test_a_discarded_snapshot_is_reported_with_its_diagnostic(tmp_path: Path) -> None:
    """Source and snapshot diagnostics from recovery are carried into the inspection and the table."""
    run = run_review(tmp_path, snapshot_every=1)  # a snapshot after every commit, the last one included
    assert build_inspection(run.recovered()).source == "snapshot"
    run.journal.corrupt_snapshot(run.run_id)
    inspection = build_inspection(run.recovered())
    assert inspection.source == "journal"
    assert inspection.diagnostics and inspection.diagnostics[0].startswith("snapshot discarded")
    assert "snapshot discarded" in render_table(inspection)


def test_json_round_trips_and_names_its_schema_version(tmp_path: Path) -> None:
    """to_json output decodes back to an equal inspection and starts with schema_version."""
    run = in_flight(tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    data = to_json(inspection)
    assert data.startswith(b'{"schema_version":2,')
    assert from_json(data) == inspection
    with pytest.raises(msgspec.ValidationError):
        from_json(data.replace(b'"schema_version":2,', b'"schema_version":2,"input":{},'))


def test_every_node_status_renders_in_the_table_and_the_diagram(tmp_path: Path) -> None:
    """Each NodeStatus value, including ones no run here reaches, renders and gets a Mermaid class."""
    run = in_flight(tmp_path)
    inspection = build_inspection(run.recovered(), run.records())
    for status in NodeStatus:
        nodes = tuple(msgspec.structs.replace(n, status=status) for n in inspection.nodes)
        variant = msgspec.structs.replace(inspection, nodes=nodes)
        assert f"  {status.value}  " in render_table(variant)
        diagram = render_mermaid(variant, run.spec)
        assert f"classDef {status.value} " in diagram
        assert f"class n0,n1,n2,n3,n4 {status.value}" in diagram


MERMAID_GOLDEN = """\
flowchart TD
    n0["plan<br/>succeeded"]
    n1["review<br/>running"]
    n2["publish<br/>pending"]
    n1 --> n2
    n0 -. "succeeded" .-> n1
    n1 -. "verdict == #quot;redo#quot; [route]" .-> n0
    classDef pending fill:#eeeeee,stroke:#9e9e9e,color:#424242
    classDef ready fill:#e3f2fd,stroke:#42a5f5,color:#0d47a1
    classDef running fill:#bbdefb,stroke:#1e88e5,color:#0d47a1
    classDef waiting fill:#fff8e1,stroke:#ffb300,color:#6d4c00
    classDef retry_pending fill:#ffe0b2,stroke:#fb8c00,color:#6d3a00
    classDef changes_requested fill:#f3e5f5,stroke:#8e24aa,color:#4a148c
    classDef succeeded fill:#c8e6c9,stroke:#43a047,color:#1b5e20
    classDef failed fill:#ffcdd2,stroke:#e53935,color:#b71c1c
    classDef blocked fill:#d7ccc8,stroke:#6d4c41,color:#3e2723
    classDef cancelled fill:#cfd8dc,stroke:#546e7a,color:#263238
    classDef skipped fill:#fafafa,stroke:#bdbdbd,color:#757575,stroke-dasharray:3 3
    class n2 pending
    class n1 running
    class n0 succeeded
"""


def test_mermaid_draws_dependencies_solid_and_conditional_edges_dashed(tmp_path: Path) -> None:
    """The diagram of a small graph matches the golden text exactly."""
    spec = WorkflowSpec(
        workflow_id="ops.loop",
        version=1,
        nodes=(
            Node("plan", handler="plan@1"),
            Node("review", handler="review@1"),
            Node("publish", handler="publish@1", depends_on=("review",)),
        ),
        edges=(
            Edge("plan", "review", when=OnOutcome(NodeOutcomeKind.SUCCEEDED)),
            Edge("review", "plan", when=OnField("verdict", "redo"), exclusive="route"),
        ),
        initial=("plan",),
    )
    harness = ReducerHarness(spec)
    harness.start("plan")
    harness.complete("plan", Succeeded(output=OUTPUT_CANARY))
    harness.start("review")
    run = persist(harness, tmp_path)
    assert render_mermaid(build_inspection(run.recovered()), spec) + "\n" == MERMAID_GOLDEN


def test_mermaid_refuses_a_spec_the_run_did_not_pin(tmp_path: Path) -> None:
    """Rendering with another spec raises instead of colouring the wrong graph."""
    run = in_flight(tmp_path)
    other = WorkflowSpec(workflow_id="ops.other", version=1, nodes=(Node("x", handler="x@1"),))
    with pytest.raises(ValueError, match="not the one run"):
        render_mermaid(build_inspection(run.recovered()), other)


def test_table_rows_stay_on_one_line_for_multiline_reasons(tmp_path: Path) -> None:
    """A reason with newlines is flattened and shortened in the table, kept whole in JSON."""
    spec = WorkflowSpec(workflow_id="ops.multi", version=1, nodes=(Node("a", handler="a@1"),))
    reason = "line one\nline two " + "x" * 200
    harness = ReducerHarness(spec)
    harness.run_script({"a": [PermanentFailure(reason=reason)]})
    inspection = build_inspection(persist(harness, tmp_path).recovered())
    table = render_table(inspection)
    row = next(line for line in table.splitlines() if line.startswith("a  "))
    assert "line one line two" in row and row.endswith("…")
    assert from_json(to_json(inspection)).nodes[0].reason == reason


@settings(max_examples=60, deadline=None)
@given(script=SCRIPTS, limit=st.integers(0, 40))
def test_any_scripted_run_inspects_consistently_and_payload_free(
    script: dict[str, list[int]], limit: int
) -> None:
    """For any outcome script: counts add up, every open or failed node is explained, nothing leaks."""
    recovered, records = scripted_run(script)
    state = recovered.state
    inspection = build_inspection(recovered, records, history_limit=limit)
    history = inspection.history
    assert history.complete == len(records) == history.retained + history.omitted
    assert history.retained == min(limit, len(records))
    assert [n.node_id for n in inspection.nodes] == ["a", "b", "c", "d"]
    assert len(inspection.attempts) == state.attempt_count == inspection.budgets.attempts_used
    unsettled = {n.node_id for n in inspection.nodes if n.status is not NodeStatus.SUCCEEDED}
    assert {d.node_id for d in inspection.blocking} == unsettled
    assert from_json(to_json(inspection)) == inspection
    assert_payload_free(inspection, state.spec)


@pytest.mark.parametrize(
    ("epoch_ms", "shown"),
    [
        (1_767_225_600_000, "epoch        2026-01-01T00:00:00.000Z (wall clock at virtual 0 ms)"),
        (10**17, f"epoch        {10**17} ms after the Unix epoch (wall clock at virtual 0 ms)"),
    ],
)
def test_the_inspection_shows_the_run_epoch_beside_the_recorded_virtual_time(
    tmp_path: Path, epoch_ms: int, shown: str
) -> None:
    """Inspection stays read-only: it shows the time as recorded, and the wall-clock epoch it counts from."""
    from mayfly.commit import commit_command
    from mayfly.local import LocalWorkflowJournal
    from mayfly.model.commands import CreateRun
    from mayfly.recovery import inspect_run

    journal = LocalWorkflowJournal(f"file://{tmp_path}/j?durability=write")
    ids = DeterministicIdSource(namespace=12)
    run_id = ids.new_id()
    spec = WorkflowSpec("ops.epoch", 1, (Node("a", handler="a@1"),))
    commit_command(journal, None, CreateRun(run_id=run_id, spec=spec, epoch_ms=epoch_ms), ids=ids)
    inspection = build_inspection(inspect_run(journal, run_id))
    assert (inspection.now, inspection.epoch_ms) == (0, epoch_ms)
    assert from_json(to_json(inspection)) == inspection
    lines = render_table(inspection).splitlines()
    assert "virtual now  0 ms (as of the last recorded fact)" in lines
    assert lines[lines.index("virtual now  0 ms (as of the last recorded fact)") + 1] == shown
