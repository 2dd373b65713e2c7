"""The Prometheus exposition: parsed by prometheus_client's text parser, over a real file journal."""

from __future__ import annotations

import enum
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mayfly import (
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    NodeOutcomeKind,
    NodeStatus,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowSpec,
)
from mayfly.runindex import IndexStatus
from mayfly.runtime import WorkflowRuntime
from mayfly.telemetry import FailureClass, MetricsCollector, RecoveryMode, WorkerEvent
from mayfly.telemetry.prometheus import CONTENT_TYPE, render, render_snapshot, render_worker
from mayfly.worker import Worker

CANARY = "canary-7f3c-do-not-export"

SPEC = WorkflowSpec(
    workflow_id=f"wf-{CANARY}",
    version=1,
    nodes=(
        Node(
            "flaky",
            handler="flaky@1",
            retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=1)),
        ),
        Node("after", handler="after@1", depends_on=("flaky",)),
    ),
)
DOOMED = WorkflowSpec(workflow_id="doomed", version=1, nodes=(Node("boom", handler="boom@1"),))

# Every label the exposition may carry, and the closed set of values each may take.
CLOSED: dict[str, set[str]] = {
    "run_state": {s.value for s in RunStatus},
    "node_state": {s.value for s in NodeStatus},
    "failure_class": {c.value for c in FailureClass},
    "outcome_class": {k.value for k in NodeOutcomeKind},
    "recovery_mode": {m.value for m in RecoveryMode},
    "index_status": {s.value for s in IndexStatus},
    "event": {e.value for e in WorkerEvent},
    "le": {"0.01", "0.1", "1.0", "10.0", "60.0", "600.0", "3600.0", "+Inf"},
}


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()
    seen: dict[str, int] = {}

    @handlers.handler("flaky")
    def flaky(request: HandlerRequest) -> Succeeded | RetryableFailure:
        seen[request.run_id] = seen.get(request.run_id, 0) + 1
        if seen[request.run_id] == 1:
            return RetryableFailure(reason="first try fails")
        return Succeeded(output={"echo": CANARY})

    @handlers.handler("after")
    def after(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=CANARY)

    @handlers.handler("boom")
    def boom(request: HandlerRequest) -> PermanentFailure:
        return PermanentFailure(reason=CANARY)

    return handlers


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed by prometheus_client, keyed by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def assert_closed_labels(text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                assert name in CLOSED, f"{sample.name} has label {name} outside the closed dimensions"
                assert value in CLOSED[name], f"{sample.name}{{{name}={value!r}}} is not a closed value"


def test_metrics_of_a_file_journal_parse_and_count_each_run_state(tmp_path: Path) -> None:
    """Succeeded, failed and never-driven runs, with a retry: the parsed exposition counts each of them."""
    url = f"file://{tmp_path}/journal"
    runtime = WorkflowRuntime(url, registry())
    ok = runtime.execute(SPEC, {"secret": CANARY})
    assert ok.status is RunStatus.SUCCEEDED
    failed = runtime.execute(DOOMED, CANARY)
    assert failed.status is RunStatus.FAILED
    runtime.start(SPEC, {"secret": CANARY})  # created, never driven: running, new in the index

    text = render(runtime.journal).decode("utf-8")
    assert CANARY not in text
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert_closed_labels(text)
    got = samples(text)

    assert got[("mayfly_runs_observed", ())] == 3
    assert got[("mayfly_runs", (("run_state", "succeeded"),))] == 1
    assert got[("mayfly_runs", (("run_state", "failed"),))] == 1
    assert got[("mayfly_runs", (("run_state", "running"),))] == 1
    assert got[("mayfly_runs", (("run_state", "cancelled"),))] == 0
    assert got[("mayfly_nodes", (("node_state", "succeeded"), ("run_state", "succeeded")))] == 2
    assert got[("mayfly_nodes", (("node_state", "failed"), ("run_state", "failed")))] == 1
    assert got[("mayfly_nodes", (("node_state", "ready"), ("run_state", "running")))] == 1
    assert got[("mayfly_node_failures", (("failure_class", "permanent_failure"),))] == 1
    # Three outcomes in the first run (a retryable failure, then two successes), one in the second.
    assert got[("mayfly_attempt_outcomes_total", (("outcome_class", "succeeded"),))] == 2
    assert got[("mayfly_attempt_outcomes_total", (("outcome_class", "retryable_failure"),))] == 1
    assert got[("mayfly_attempt_outcomes_total", (("outcome_class", "permanent_failure"),))] == 1
    # Histograms are cumulative and end at +Inf == _count.
    assert got[("mayfly_attempt_latency_seconds_count", (("outcome_class", "succeeded"),))] == 2
    assert (
        got[("mayfly_attempt_latency_seconds_bucket", (("le", "+Inf"), ("outcome_class", "succeeded")))] == 2
    )
    assert got[("mayfly_run_duration_seconds_count", (("run_state", "succeeded"),))] == 1
    assert got[("mayfly_run_duration_seconds_count", (("run_state", "failed"),))] == 1
    succeeded_buckets = [
        v
        for (name, labels), v in got.items()
        if name == "mayfly_attempt_latency_seconds_bucket" and ("outcome_class", "succeeded") in labels
    ]
    assert succeeded_buckets == sorted(succeeded_buckets)
    assert got[("mayfly_runs_unreadable", ())] == 0
    # The file journal keeps a run index: two terminal runs and one new, due at once.
    assert got[("mayfly_index_runs", (("index_status", "terminal"),))] == 2
    assert got[("mayfly_index_runs", (("index_status", "new"),))] == 1
    assert got[("mayfly_index_runs_due", ())] == 1
    # Before the new run's creation nothing was due.
    early = samples(render(runtime.journal, now_ms=0).decode())
    assert early[("mayfly_index_runs_due", ())] == 0


def test_a_corrupt_history_is_counted_unreadable_not_a_failed_scrape(tmp_path: Path) -> None:
    """A flipped bit in one run's history leaves the other runs counted and the broken one reported."""
    url = f"file://{tmp_path}/journal"
    runtime = WorkflowRuntime(url, registry())
    runtime.execute(DOOMED, None)
    broken = runtime.execute(DOOMED, None, run_id="0193a5c4-7b1e-7c3d-9f00-00000000dead")
    del broken
    files = [p for p in (tmp_path / "journal").rglob("*") if p.is_file() and "dead" in str(p)]
    assert files, "the file journal keeps the run's records in a file named after the run"
    target = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    got = samples(render(runtime.journal).decode())
    assert got[("mayfly_runs_unreadable", ())] == 1
    assert got[("mayfly_runs", (("run_state", "failed"),))] == 1


def test_a_snapshot_with_recoveries_renders_them(tmp_path: Path) -> None:
    """render_snapshot exposes an application's own collector, recoveries included."""
    collector = MetricsCollector()
    collector.add_recovery(RecoveryMode.RESUME)
    collector.add_recovery(RecoveryMode.RESUME)
    collector.add_recovery(RecoveryMode.INSPECT)
    text = render_snapshot(collector.snapshot()).decode()
    assert_closed_labels(text)
    got = samples(text)
    assert got[("mayfly_recoveries_total", (("recovery_mode", "resume"),))] == 2
    assert got[("mayfly_recoveries_total", (("recovery_mode", "inspect"),))] == 1
    assert got[("mayfly_recoveries_total", (("recovery_mode", "replay"),))] == 0


def test_a_worker_counts_its_claims_and_renders_them(tmp_path: Path) -> None:
    """worker.metrics() counts the claims the worker made; render_worker parses with closed labels."""
    url = f"file://{tmp_path}/journal"
    runtime = WorkflowRuntime(url, registry())
    runs = [runtime.start(SPEC, None).run_id for _ in range(2)]
    worker = Worker(url, registry(), poll_interval_ms=20, log=lambda record: None)
    deadline = time.monotonic() + 30
    worker.run(
        until=lambda: (
            time.monotonic() > deadline or all(runtime.handle(r).status() == "succeeded" for r in runs)
        )
    )
    assert all(runtime.handle(r).status() == "succeeded" for r in runs)
    metrics = worker.metrics()
    assert metrics.events[WorkerEvent.CLAIMED] == worker.claimed >= 2
    assert metrics.events.get(WorkerEvent.LOST, 0) == 0
    assert metrics.concurrency == worker.concurrency
    text = render_worker(metrics).decode()
    assert_closed_labels(text)
    got = samples(text)
    assert got[("mayfly_worker_claims_total", ())] == worker.claimed
    assert got[("mayfly_worker_lease_losses_total", ())] == 0
    assert got[("mayfly_worker_events_total", (("event", "ended"),))] == worker.ended == 2
    assert got[("mayfly_worker_active_runs", ())] == 0
    assert all(isinstance(e, enum.Enum) for e in metrics.events)


def test_every_sample_follows_its_family_declaration(tmp_path: Path) -> None:
    """Format 0.0.4 structure: HELP then TYPE once per family, each sample named as its family declares."""
    runtime = WorkflowRuntime(f"file://{tmp_path}/journal", registry())
    runtime.execute(SPEC, None)
    worker = Worker(f"file://{tmp_path}/journal", registry(), log=lambda record: None)
    for text in (render(runtime.journal).decode(), render_worker(worker.metrics()).decode()):
        assert text.endswith("\n")
        declared: dict[str, str] = {}
        current: tuple[str, str] | None = None
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
                assert name not in declared, f"family {name} declared twice"
            elif line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                declared[name] = kind
                current = (name, kind)
            else:
                assert current is not None, f"sample before any TYPE: {line}"
                sample = line.split("{")[0].split(" ")[0]
                name, kind = current
                allowed = {name} if kind != "histogram" else {f"{name}_bucket", f"{name}_count"}
                assert sample in allowed, f"{sample} under TYPE {name} {kind}"
                assert kind != "counter" or name.endswith("_total")
        kinds = {family.name: family.type for family in text_string_to_metric_families(text)}
        for name, kind in declared.items():
            assert kinds[name.removesuffix("_total") if kind == "counter" else name] == kind
