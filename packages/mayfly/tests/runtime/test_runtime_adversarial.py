"""Adversarial runtime tests: SIGKILL at every step of a run, BaseException handlers, lease upkeep."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mayfly import (
    HandlerRegistry,
    HandlerRequest,
    Node,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.identity import Uuid7IdSource
from mayfly.lease import RecoveryLeaseGuard
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.errors import CommandRejected, LeaseLost
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted, RetryReleased, RetryScheduled
from mayfly.model.ids import idempotency_key
from mayfly.model.spec import RunBudgets
from mayfly.model.state import NodeStatus
from mayfly.reducer import decode_event
from mayfly.runtime import WaitForSignal, new_signal_token
from mayfly.substrate import Hub, VirtualClock, now_ms, sleep, spawn

WORKER = Path(__file__).with_name("adversarial_worker.py")
sys.path.insert(0, str(WORKER.parent))
import adversarial_worker  # noqa: E402


def events(journal: LocalWorkflowJournal, run_id: str) -> list[Any]:
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def worker(url: str, run_id: str, mode: str, kill_at: str, log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), url, run_id, mode, kill_at, str(log)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("kill_at", ["started", "handler", "returned", "wait", "backoff"])
def test_sigkill_at_each_step_then_resume_loses_and_duplicates_nothing(tmp_path: Path, kill_at: str) -> None:
    """After SIGKILL at any step, a new process resumes: one outcome per attempt, original ids, retry never early."""
    url = f"file://{tmp_path}/journal?durability=fsync"
    run_id = Uuid7IdSource().new_id()
    log = tmp_path / "invocations.log"
    killed = worker(url, run_id, "execute", kill_at, log)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = LocalWorkflowJournal(url)
    before = events(journal, run_id)
    in_flight = {e.node_id: e.attempt_id for e in before if isinstance(e, NodeStarted)}

    resumed = worker(url, run_id, "resume", "none", log)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[-1] == "done running gate"

    # Answer the approval in this process and finish the run.
    registry = HandlerRegistry()
    registry.register("step", 1, lambda req: Succeeded())
    registry.register("gate", 1, lambda req: Succeeded(output=req.signal.decision if req.signal else None))
    runtime = WorkflowRuntime(journal, registry, leases=LocalLeaseStore(url))
    assert runtime.signal(run_id, "gate", adversarial_worker.TOKEN, "go").status == "accepted"
    assert runtime.resume(run_id).status is RunStatus.SUCCEEDED

    history = events(journal, run_id)
    outcomes = [e for e in history if isinstance(e, NodeOutcomeCommitted) and e.attempt_id is not None]
    assert len({e.attempt_id for e in outcomes}) == len(outcomes)  # never two outcomes for one attempt
    assert sorted(e.node_id for e in outcomes) == ["a", "flaky", "flaky", "gate", "z"]
    invocations = [line.split() for line in log.read_text().splitlines()]
    for node_id, attempt_id, key, _ in invocations:
        assert key == idempotency_key(run_id, node_id, attempt_id)
    if kill_at in ("started", "handler", "returned"):
        # The in-flight attempt of `a` is re-invoked under its original attempt id and key.
        assert [i[1] for i in invocations if i[0] == "a"][-1] == in_flight["a"]
        assert [e.attempt_id for e in history if isinstance(e, NodeStarted) and e.node_id == "a"] == [
            in_flight["a"]
        ]
    scheduled = [e for e in history if isinstance(e, RetryScheduled)]
    released = [e for e in history if isinstance(e, RetryReleased)]
    assert len(scheduled) == len(released) == 1
    assert released[0].at >= scheduled[0].deadline


class CountingGuard:
    """A real local lease guard that records when it is renewed."""

    def __init__(self, guard: RecoveryLeaseGuard, renewals: list[int]) -> None:
        self._guard = guard
        self._renewals = renewals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._guard, name)

    def renew(self, ttl_ms: int) -> None:
        self._renewals.append(now_ms())
        self._guard.renew(ttl_ms)

    def __enter__(self) -> CountingGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self._guard.release()


class CountingLeases:
    """The real local lease store, handing out guards that record their renewals (hub time, ms)."""

    def __init__(self, url: str) -> None:
        self._store = LocalLeaseStore(url)
        self.renewals: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> RecoveryLeaseGuard:
        return CountingGuard(self._store.acquire(run_id, owner, ttl_ms), self.renewals)  # type: ignore[return-value]


def test_current_task_mode_renews_its_lease_between_serial_handlers(tmp_path: Path) -> None:
    """A current-task run longer than its lease TTL renews the lease, so no other owner can take it mid-run."""
    url = f"file://{tmp_path}/j?durability=write"
    leases = CountingLeases(url)
    registry = HandlerRegistry()

    @registry.handler("nap", cooperative=True)
    def nap(req: HandlerRequest) -> Succeeded:
        sleep(4)  # virtual seconds: the chain takes 24 s against a 10 s lease
        return Succeeded()

    nodes = tuple(Node(f"n{i}", handler="nap@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(6))
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=leases, lease_ttl_ms=10_000)
    spec = WorkflowSpec(workflow_id="adv.chain", version=1, nodes=nodes)
    result = Hub(VirtualClock()).run(runtime.execute_in_current_task, spec)
    assert result.status is RunStatus.SUCCEEDED
    marks = [0, *leases.renewals, 24_000]
    assert max(b - a for a, b in itertools.pairwise(marks)) < 10_000, leases.renewals


def test_a_long_inline_handler_does_not_outlive_the_lease(tmp_path: Path) -> None:
    """One inline handler running past the lease TTL still has the lease renewed while it runs."""
    url = f"file://{tmp_path}/j?durability=write"
    leases = CountingLeases(url)
    registry = HandlerRegistry()

    @registry.handler("long", cooperative=True)
    def long(req: HandlerRequest) -> Succeeded:
        sleep(35)
        return Succeeded()

    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=leases, lease_ttl_ms=10_000)
    spec = WorkflowSpec(workflow_id="adv.long", version=1, nodes=(Node("a", handler="long@1"),))
    result = Hub(VirtualClock()).run(runtime.execute_in_current_task, spec)
    assert result.status is RunStatus.SUCCEEDED
    marks = [0, *leases.renewals, 35_000]
    assert max(b - a for a, b in itertools.pairwise(marks)) < 10_000, leases.renewals


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("cooperative", [False, True])
def test_a_handler_raising_a_base_exception_stops_the_run_resumably(
    tmp_path: Path, error: type[BaseException], cooperative: bool
) -> None:
    """KeyboardInterrupt/SystemExit in a handler propagates out of execute; the attempt stays in flight for resume."""
    url = f"file://{tmp_path}/j?durability=write"
    journal = LocalWorkflowJournal(url)
    calls: list[str] = []
    registry = HandlerRegistry()

    def stop(req: HandlerRequest) -> Succeeded:
        calls.append(req.attempt_id)
        if len(calls) == 1:
            raise error
        return Succeeded()

    registry.register("stop", 1, stop, cooperative=cooperative)
    runtime = WorkflowRuntime(journal, registry, leases=LocalLeaseStore(url))
    spec = WorkflowSpec(workflow_id="adv.base", version=1, nodes=(Node("a", handler="stop@1"),))
    run_id = runtime.ids.new_id()
    with pytest.raises(error):
        runtime.execute(spec, run_id=run_id)
    # No outcome was recorded for the interrupted attempt, and the lease was released.
    assert not [e for e in events(journal, run_id) if isinstance(e, NodeOutcomeCommitted)]
    result = runtime.resume(run_id)
    assert result.status is RunStatus.SUCCEEDED
    assert result.nodes["a"].status is NodeStatus.SUCCEEDED
    assert calls[0] == calls[1]  # re-invoked under the original attempt id


def test_generated_signal_tokens_never_start_with_a_dash() -> None:
    """A token from new_signal_token can be pasted after `--token` on a command line (no leading dash)."""
    # A leading dash has odds 1/64 per token: 4,000 draws would all miss it with odds below 1e-27.
    assert not [raw for raw in (new_signal_token().reveal() for _ in range(4_000)) if raw.startswith("-")]


def test_a_run_budget_does_not_stop_execute_from_detaching_at_a_wait(tmp_path: Path) -> None:
    """A parked run with an elapsed budget detaches like any other; the budget does not hold the hub until it ends."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    token = new_signal_token()
    registry.register("wait", 1, lambda req: Succeeded() if req.signal else WaitForSignal("go", token))
    runtime = WorkflowRuntime(
        LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url), clock=VirtualClock
    )
    spec = WorkflowSpec(
        workflow_id="adv.budget",
        version=1,
        nodes=(Node("a", handler="wait@1"),),
        budgets=RunBudgets(max_elapsed_ms=3_600_000),
    )
    parked = runtime.execute(spec)
    assert parked.status is RunStatus.RUNNING
    assert parked.waiting == {"a": "go"}
    assert runtime.signal(parked.run_id, "a", token, "ok").status == "accepted"
    assert runtime.resume(parked.run_id).status is RunStatus.SUCCEEDED


def test_a_signal_queued_behind_the_runs_end_is_answered_not_left_hanging(tmp_path: Path) -> None:
    """A signal sent to a live driver that ends the run first is refused (run_terminal); the sender never hangs."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    token = new_signal_token()
    registry.register(
        "wait", 1, lambda req: Succeeded() if req.signal else WaitForSignal("go", token), cooperative=True
    )
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url))
    spec = WorkflowSpec(workflow_id="adv.late-signal", version=1, nodes=(Node("a", handler="wait@1"),))
    run_id = runtime.ids.new_id()
    refused: list[str] = []

    def sender() -> None:
        sleep(0.05)
        runtime.cancel(run_id, reason="stop")  # queued first: the driver ends the run before the signal
        try:
            runtime.signal(run_id, "a", token, "late")
        except CommandRejected as exc:
            refused.append(str(exc))

    def drive() -> Any:
        task = spawn(sender)
        result = runtime.execute_in_current_task(spec, run_id=run_id)
        task.join(timeout=5)
        return result

    result = Hub().run(drive)
    assert result.status is RunStatus.CANCELLED
    assert len(refused) == 1 and "run_terminal" in refused[0]


def test_registering_something_that_is_not_callable_is_refused_up_front() -> None:
    """A registry refuses a non-callable handler at registration, before any run records a failure for it."""
    registry = HandlerRegistry()
    with pytest.raises(TypeError, match=r"handler review@1 must be callable, got str"):
        registry.register("review", 1, "review_fn")  # type: ignore[arg-type]
    assert "review@1" not in registry


@pytest.mark.parametrize("cooperative", [False, True])
def test_an_oversized_output_is_a_permanent_failure_not_a_crash(tmp_path: Path, cooperative: bool) -> None:
    """A handler producing output over the 64 KiB inline limit fails its node permanently; the run ends normally."""
    url = f"file://{tmp_path}/j?durability=write"
    calls: list[int] = []
    registry = HandlerRegistry()

    def huge(req: HandlerRequest) -> Succeeded:
        calls.append(req.attempt)
        return Succeeded(output="x" * 70_000)

    registry.register("huge", 1, huge, cooperative=cooperative)
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url))
    result = runtime.execute(
        WorkflowSpec(workflow_id="adv.huge", version=1, nodes=(Node("a", handler="huge@1"),))
    )
    assert result.status is RunStatus.FAILED
    assert result.nodes["a"].outcome is not None and result.nodes["a"].outcome.value == "permanent_failure"
    assert "LimitExceeded" in result.nodes["a"].reason and calls == [1]  # never retried


def test_a_non_finite_run_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Run input containing NaN is refused like any non-JSON value (ValueError), with nothing written."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    registry.register("ok", 1, lambda req: Succeeded(output=req.run_input))
    journal = LocalWorkflowJournal(url)
    runtime = WorkflowRuntime(journal, registry, leases=LocalLeaseStore(url))
    spec = WorkflowSpec(workflow_id="adv.nan", version=1, nodes=(Node("a", handler="ok@1"),))
    with pytest.raises(ValueError, match="JSON"):
        runtime.execute(spec, {"score": float("nan")})
    assert journal.list_runs(after=None, limit=10) == []


def test_a_non_finite_output_fails_the_node_instead_of_turning_into_null(tmp_path: Path) -> None:
    """A handler returning Succeeded(output=inf) fails (ValueError in the handler), it does not succeed with inf."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    registry.register("inf", 1, lambda req: Succeeded(output={"score": float("inf")}))
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url))
    spec = WorkflowSpec(
        workflow_id="adv.inf",
        version=1,
        nodes=(Node("a", handler="inf@1", retry=RetryPolicy(max_attempts=1)),),
    )
    result = runtime.execute(spec)
    assert result.nodes["a"].status is NodeStatus.FAILED


@pytest.mark.parametrize(
    ("option", "value"), [("lease_ttl_ms", 2), ("lease_ttl_ms", 0), ("snapshot_every", 0)]
)
def test_unusable_runtime_settings_are_refused_at_construction(
    tmp_path: Path, option: str, value: int
) -> None:
    """A lease TTL too short to renew (it made the driver spin) or a snapshot interval under 1 is a ValueError."""
    url = f"file://{tmp_path}/j?durability=write"
    with pytest.raises(ValueError, match=option):
        WorkflowRuntime(
            LocalWorkflowJournal(url), HandlerRegistry(), leases=LocalLeaseStore(url), **{option: value}
        )


def test_executing_an_existing_run_id_is_a_run_exists_rejection(tmp_path: Path) -> None:
    """execute() with the id of an existing run is refused as run_exists (not a raw AppendConflict), nothing written."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    registry.register("ok", 1, lambda req: Succeeded())
    journal = LocalWorkflowJournal(url)
    runtime = WorkflowRuntime(journal, registry, leases=LocalLeaseStore(url))
    spec = WorkflowSpec(workflow_id="adv.twice", version=1, nodes=(Node("a", handler="ok@1"),))
    first = runtime.execute(spec)
    with pytest.raises(CommandRejected, match="run_exists") as refused:
        runtime.execute(spec, run_id=first.run_id)
    assert refused.value.rejection.code.value == "run_exists"  # type: ignore[attr-defined]
    assert len(journal.read(first.run_id)) == first.sequence


def test_a_result_that_arrives_after_its_attempt_deadline_loses_to_the_deadline(tmp_path: Path) -> None:
    """A cooperative handler that blocks the hub past its deadline does not get its late success committed."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()

    def hog(req: HandlerRequest) -> Succeeded:
        time.sleep(0.4)  # blocks the hub: the deadline timer cannot fire before this returns
        return Succeeded(output="late")

    registry.register("hog", 1, hog, cooperative=True)
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url))
    retry = RetryPolicy(max_attempts=1, attempt_deadline_ms=100)
    spec = WorkflowSpec(workflow_id="adv.late", version=1, nodes=(Node("a", handler="hog@1", retry=retry),))
    result = runtime.execute(spec)
    assert result.status is RunStatus.FAILED
    assert result.outputs == {} and "deadline" in result.nodes["a"].reason


def test_a_signal_that_arrives_after_the_wait_deadline_finds_the_wait_expired(tmp_path: Path) -> None:
    """A signal queued for a live driver after its wait's deadline passed is refused, not accepted late."""
    url = f"file://{tmp_path}/j?durability=write"
    registry = HandlerRegistry()
    token = new_signal_token()
    registry.register(
        "wait",
        1,
        lambda req: Succeeded() if req.signal else WaitForSignal("go", token, timeout_ms=100),
        cooperative=True,
    )
    runtime = WorkflowRuntime(LocalWorkflowJournal(url), registry, leases=LocalLeaseStore(url))
    retry = RetryPolicy(max_attempts=1)
    spec = WorkflowSpec(
        workflow_id="adv.expired", version=1, nodes=(Node("a", handler="wait@1", retry=retry),)
    )
    run_id = runtime.ids.new_id()
    dispositions: list[str] = []

    def late_sender() -> None:
        sleep(0.02)
        time.sleep(0.3)  # blocks the hub past the wait's 100 ms deadline
        try:
            dispositions.append(runtime.signal(run_id, "a", token, "late").status)
        except CommandRejected as refused:  # the expiry failed the one-attempt node and so the run
            dispositions.append(str(refused.rejection.code.value))  # type: ignore[attr-defined]

    def drive() -> Any:
        task = spawn(late_sender)
        result = runtime.execute_in_current_task(spec, run_id=run_id)
        task.join(timeout=5)
        return result

    result = Hub().run(drive)
    assert dispositions == ["run_terminal"]
    assert result.status is RunStatus.FAILED and "expired" in result.nodes["a"].reason


def test_a_standalone_run_renews_its_lease_while_a_long_handler_runs(tmp_path: Path) -> None:
    """In the standalone mode the lease keeper renews while the driver only waits for a long handler."""
    url = f"file://{tmp_path}/j?durability=write"
    leases = CountingLeases(url)
    registry = HandlerRegistry()

    @registry.handler("long", cooperative=True)
    def long(req: HandlerRequest) -> Succeeded:
        sleep(35)
        return Succeeded()

    runtime = WorkflowRuntime(
        LocalWorkflowJournal(url), registry, leases=leases, lease_ttl_ms=10_000, clock=VirtualClock
    )
    spec = WorkflowSpec(workflow_id="adv.long.standalone", version=1, nodes=(Node("a", handler="long@1"),))
    result = runtime.execute(spec)
    assert result.status is RunStatus.SUCCEEDED
    marks = [0, *leases.renewals, 35_000]
    assert max(b - a for a, b in itertools.pairwise(marks)) < 10_000, leases.renewals


class LosingGuard(CountingGuard):
    """A lease guard whose renewals fail from the second one on: the lease was taken over meanwhile."""

    def renew(self, ttl_ms: int) -> None:
        self._renewals.append(now_ms())
        if len(self._renewals) > 1:
            raise LeaseLost("recovery lease was taken over by w-2 (test)")
        self._guard.renew(ttl_ms)


class LosingLeases(CountingLeases):
    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> RecoveryLeaseGuard:
        return LosingGuard(self._store.acquire(run_id, owner, ttl_ms), self.renewals)  # type: ignore[return-value]


def test_a_lease_lost_while_a_handler_runs_stops_the_run_at_once_and_cancels_the_handler(
    tmp_path: Path,
) -> None:
    """The keeper's failed renewal stops the driver then, not when the handler returns, and cancels it."""
    url = f"file://{tmp_path}/j?durability=write"
    leases = LosingLeases(url)
    registry = HandlerRegistry()
    finished: list[int] = []

    @registry.handler("long", cooperative=True)
    def long(req: HandlerRequest) -> Succeeded:
        sleep(3_600)
        finished.append(now_ms())
        return Succeeded()

    runtime = WorkflowRuntime(
        LocalWorkflowJournal(url), registry, leases=leases, lease_ttl_ms=9_000, clock=VirtualClock
    )
    spec = WorkflowSpec(workflow_id="adv.lost", version=1, nodes=(Node("a", handler="long@1"),))
    with pytest.raises(LeaseLost, match="taken over"):
        runtime.execute(spec)
    assert leases.renewals == [3_000, 6_000]  # the keeper's two renewals; the second one failed
    assert finished == []  # the handler was cancelled, not left to run out its hour


class Partition:
    """A network partition on the hub's virtual clock: from ``start`` until ``start + length`` ms."""

    def __init__(self, length_ms: int) -> None:
        self.length_ms = length_ms
        self.start: int | None = None

    def hold(self) -> None:
        """Park until the partition heals (at once if there is none now)."""
        if self.start is not None and now_ms() < self.start + self.length_ms:
            sleep((self.start + self.length_ms - now_ms()) / 1000)


class HeldUpJournal:
    """A real journal whose append that starts node ``b`` commits, then has its answer held up by a partition."""

    def __init__(self, inner: LocalWorkflowJournal, partition: Partition) -> None:
        self._inner = inner
        self._partition = partition

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _answer(self, batch: Any, result: Any) -> Any:
        """``result`` at once, or, for the batch that starts ``b``, once the partition that begins now heals."""
        if any(
            r.event_type == "NodeStarted"
            and decode_event(r.event_type, r.schema_version, r.payload).node_id == "b"
            for r in batch
        ):
            self._partition.start = now_ms()  # committed; the answer is lost in the partition
            self._partition.hold()
        return result

    def append(self, run_id: str, expected_next: int, batch: Any, **kwargs: Any) -> Any:
        return self._answer(batch, self._inner.append(run_id, expected_next, batch, **kwargs))

    def append_indexed(self, run_id: str, expected_next: int, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self._answer(batch, self._inner.append_indexed(run_id, expected_next, batch, *args, **kwargs))


class PartitionedGuard(CountingGuard):
    """A lease guard cut off by the partition: a renewal sent during it is answered after the heal (later than
    the held-up append's answer) and finds the run taken over."""

    def __init__(self, guard: RecoveryLeaseGuard, renewals: list[int], partition: Partition) -> None:
        super().__init__(guard, renewals)
        self._partition = partition

    def renew(self, ttl_ms: int) -> None:
        self._renewals.append(now_ms())
        if self._partition.start is not None:
            self._partition.hold()
            sleep(0.5)
            raise LeaseLost("recovery lease expired during the partition and was taken over by w-2 (test)")
        self._guard.renew(ttl_ms)


def test_a_commit_answered_after_the_lease_could_have_lapsed_starts_no_handler(tmp_path: Path) -> None:
    """The append that starts b commits under the lease, but its answer comes 3 TTLs later (a partition).

    Meanwhile another worker may have taken the run over and run b to success: b must not start here. The
    driver confirms its lease before starting a handler, and stops with LeaseLost."""
    url = f"file://{tmp_path}/j?durability=write"
    partition = Partition(length_ms=27_000)
    store = LocalLeaseStore(url)
    renewals: list[int] = []
    registry = HandlerRegistry()
    invoked: list[str] = []

    @registry.handler("step")
    def step(req: HandlerRequest) -> Succeeded:
        invoked.append(req.node_id)
        return Succeeded()

    class Leases(CountingLeases):
        def acquire(self, run_id: str, owner: str, ttl_ms: int) -> RecoveryLeaseGuard:
            return PartitionedGuard(store.acquire(run_id, owner, ttl_ms), renewals, partition)  # type: ignore[return-value]

    journal = HeldUpJournal(LocalWorkflowJournal(url), partition)
    runtime = WorkflowRuntime(journal, registry, leases=Leases(url), lease_ttl_ms=9_000, clock=VirtualClock)  # type: ignore[arg-type]
    spec = WorkflowSpec(
        workflow_id="adv.partition",
        version=1,
        nodes=(Node("a", handler="step@1"), Node("b", handler="step@1", depends_on=("a",))),
    )
    with pytest.raises(LeaseLost, match="taken over"):
        runtime.execute(spec)
    assert invoked == ["a"]  # b's start is committed (the next owner runs it), but it never ran here
    assert partition.start is not None and renewals and renewals[-1] >= partition.start
