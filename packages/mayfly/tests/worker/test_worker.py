"""The worker in one process: what it claims, what it leaves alone, how it parks runs and what it tells."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mayfly import HandlerRegistry, Node, RetryableFailure, Succeeded, WorkflowSpec
from mayfly.model.spec import ChildCall, ChildDefinition, FixedBackoff, RetryPolicy
from mayfly.runindex import IndexStatus
from mayfly.runtime import WaitForSignal, WorkflowRuntime, new_signal_token
from mayfly.worker import Worker, WorkerUnsupported


def chain(name: str, *handlers: str) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=h, depends_on=(f"n{i - 1}",) if i else ()) for i, h in enumerate(handlers)
    )
    return WorkflowSpec(workflow_id=f"worker.{name}", version=1, nodes=nodes)


def serve_until(worker: Worker, done: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Run ``worker`` on this thread until ``done(log)`` holds; return its log."""
    log: list[dict[str, Any]] = []
    worker._log = log.append
    deadline = time.monotonic() + timeout
    worker.run(until=lambda: done(log) or time.monotonic() > deadline)
    return log


def events(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in log if e["event"] == kind]


def test_a_run_whose_handlers_the_worker_lacks_is_left_untouched_and_reported_once(tmp_path: Path) -> None:
    """A worker without a run's handler refuses it once, writes nothing, and keeps serving other runs."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("known", 1, lambda req: Succeeded())
    runtime = WorkflowRuntime(url, reg)
    alien = runtime.start(chain("alien", "missing@1"))
    served = runtime.start(chain("known", "known@1"))
    before = runtime.journal.next_sequence(alien.run_id)
    log = serve_until(Worker(url, reg, poll_interval_ms=20), lambda log: len(events(log, "ended")) == 1)
    refused = events(log, "refused")
    assert [e["run_id"] for e in refused] == [alien.run_id]  # said once, however often it polled
    assert "missing@1" in refused[0]["error"]
    assert runtime.journal.next_sequence(alien.run_id) == before
    assert served.status() == "succeeded"
    # Its lease was released at once: another process (with the handler) takes it without waiting.
    runtime.leases.acquire(alien.run_id, "another", 1_000).release()


def test_a_cooperative_handler_that_hogs_the_hub_is_named(tmp_path: Path) -> None:
    """A cooperative handler computing without yielding is diagnosed with its name and how long it held the hub."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()

    def busy(req: Any) -> Any:
        time.sleep(0.3)  # blocks the hub: the mistake being diagnosed
        return Succeeded()

    reg.register("busy", 1, busy, cooperative=True)
    runtime = WorkflowRuntime(url, reg, lease_ttl_ms=1_000)
    runtime.start(chain("busy", "busy@1"))
    log = serve_until(Worker(url, reg, lease_ttl_ms=1_000), lambda log: len(events(log, "ended")) == 1)
    (hog,) = events(log, "hog")
    assert "busy@1" in hog["task"] and hog["ms"] >= 250
    assert "lease renewal" in hog["error"]


def test_a_run_waiting_on_a_long_backoff_is_parked_and_woken_by_the_index(tmp_path: Path) -> None:
    """A retry backoff longer than the poll interval frees the slot: the run is waiting in the index until due."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    calls: list[int] = []

    def flaky(req: Any) -> Any:
        calls.append(req.attempt)
        return RetryableFailure(reason="again") if req.attempt == 1 else Succeeded()

    reg.register("flaky", 1, flaky)
    retry = RetryPolicy(max_attempts=2, backoff=FixedBackoff(delay_ms=600))
    spec = WorkflowSpec(
        workflow_id="worker.backoff", version=1, nodes=(Node("f", handler="flaky@1", retry=retry),)
    )
    runtime = WorkflowRuntime(url, reg)
    handle = runtime.start(spec)
    seen: list[Any] = []

    def parked_then_ended(log: list[dict[str, Any]]) -> bool:
        if events(log, "parked") and not seen:
            seen.append(runtime.journal.index_get(handle.run_id))
        return bool(events(log, "ended"))

    log = serve_until(Worker(url, reg, poll_interval_ms=50), parked_then_ended)
    assert calls == [1, 2]
    assert seen and seen[0].status is IndexStatus.WAITING and seen[0].ready_at_ms is not None
    assert [e["event"] for e in log if e.get("run_id") == handle.run_id][:2] == ["claimed", "parked"]


def test_a_parent_parked_on_its_child_is_waiting_until_the_child_is_signalled(tmp_path: Path) -> None:
    """A run whose only work is a parked child waits until the child's deadline; the child's signal wakes it."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    tokens: dict[str, str] = {}

    def approve(req: Any) -> Any:
        if req.signal is None:
            token = new_signal_token()
            tokens["token"] = token.reveal()
            tokens["run"] = req.run_id
            return WaitForSignal("ok", token, timeout_ms=3_600_000)
        return Succeeded()

    reg.register("approve", 1, approve)
    child = ChildDefinition(workflow_id="worker.child", version=1, nodes=(Node("a", handler="approve@1"),))
    spec = WorkflowSpec(
        workflow_id="worker.parent",
        version=1,
        nodes=(Node("call", child=ChildCall(workflow_id="worker.child", version=1, mode="require_success")),),
        catalog=(child,),
    )
    runtime = WorkflowRuntime(url, reg)
    handle = runtime.start(spec)
    serve_until(Worker(url, reg, poll_interval_ms=20), lambda log: bool(events(log, "parked")))
    entry = runtime.journal.index_get(handle.run_id)
    child_entry = runtime.journal.index_get(tokens["run"])
    assert entry is not None and child_entry is not None and child_entry.parent == handle.run_id
    # It wakes when its child's wait would expire (an hour from now), or when the child is signalled.
    assert entry.status is IndexStatus.WAITING and entry.ready_at_ms == child_entry.ready_at_ms
    assert handle.status() == "waiting"
    runtime.signal(tokens["run"], "a", tokens["token"], {"ok": True})
    assert runtime.journal.index_get(handle.run_id).wake  # type: ignore[union-attr]
    log = serve_until(Worker(url, reg, poll_interval_ms=20), lambda log: bool(events(log, "ended")))
    assert events(log, "ended")[0]["run_id"] == handle.run_id
    assert handle.status() == "succeeded"


def test_a_journal_without_a_run_index_is_refused_by_name(tmp_path: Path) -> None:
    """A worker on a store that keeps no run index refuses to start and says which backends can."""
    from mayfly.journal import JournalCapabilities

    url = f"file://{tmp_path}/store"
    runtime = WorkflowRuntime(url)

    class Plain:
        def __getattr__(self, name: str) -> Any:
            return getattr(runtime.journal, name)

        @property
        def capabilities(self) -> JournalCapabilities:
            return JournalCapabilities.declare(runtime.journal.durability, "cross_process fencing")

    with pytest.raises(WorkerUnsupported, match="keeps no run index"):
        Worker(Plain(), HandlerRegistry(), leases=runtime.leases)  # type: ignore[arg-type]


def test_start_with_a_chosen_run_id_creates_the_run_once(tmp_path: Path) -> None:
    """Starting an existing run id returns its handle and writes nothing; the run is created with its queue."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime = WorkflowRuntime(url, HandlerRegistry())
    spec = chain("once", "x@1")
    run_id = runtime.ids.new_id()
    first = runtime.start(spec, {"n": 1}, run_id=run_id, queue="billing")
    assert first.run_id == run_id and first.status() == "running"
    before = runtime.journal.next_sequence(run_id)
    again = runtime.start(spec, {"n": 2}, run_id=run_id, queue="other")
    assert again.run_id == run_id
    assert runtime.journal.next_sequence(run_id) == before > 1
    state = runtime.inspect(run_id).state
    assert state.queue == "billing" and state.input == {"n": 1}


def test_start_creates_nothing_for_a_run_id_another_process_leased_first(tmp_path: Path) -> None:
    """A start racing a process that took the id's lease to create and drive it leaves the id to that process."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime = WorkflowRuntime(url, HandlerRegistry())
    run_id = runtime.ids.new_id()
    with runtime.leases.acquire(run_id, "creator", 10_000):
        handle = runtime.start(chain("raced", "x@1"), run_id=run_id)
    assert handle.run_id == run_id
    assert runtime.journal.next_sequence(run_id) == 1  # nothing written: the lease holder creates it


def _left_runnable(runtime: WorkflowRuntime, run_id: str) -> None:
    """The entry a SIGKILL leaves between a run's frames and its exact entry: runnable, at the run's sequence.

    The file journal writes a *more claimable* entry before the frames and the
    exact one after them, so a crash in between leaves this one behind.
    """
    stored = runtime.journal.index_get(run_id)
    assert stored is not None
    runtime.journal.index_put([msgspec.structs.replace(stored, status=IndexStatus.RUNNING, ready_at_ms=0)])
    assert runtime.journal.index_get(run_id).status is IndexStatus.RUNNING  # type: ignore[union-attr]


def test_a_finished_run_left_claimable_by_a_crash_is_claimed_once_and_does_not_starve_the_queue(
    tmp_path: Path,
) -> None:
    """A run that ended but whose index entry a crash left runnable is claimed once, its entry set to terminal.

    Found by the simulator's SIGKILL family under load: a one-slot worker
    claimed such a run first on every poll (the oldest entry) and found
    nothing to do, and the runs behind it never ran.
    """
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("ok", 1, lambda req: Succeeded())
    runtime = WorkflowRuntime(url, reg)
    ended = runtime.execute(chain("ended", "ok@1"))
    assert ended.status.value == "succeeded"
    _left_runnable(runtime, ended.run_id)
    waiting = runtime.start(chain("behind", "ok@1"))
    log = serve_until(
        Worker(url, reg, poll_interval_ms=20, concurrency=1),
        lambda log: any(e["run_id"] == waiting.run_id for e in events(log, "ended")),
        timeout=10.0,
    )
    assert waiting.status() == "succeeded"
    assert [e["run_id"] for e in events(log, "claimed")].count(ended.run_id) == 1
    assert runtime.journal.index_get(ended.run_id).status is IndexStatus.TERMINAL  # type: ignore[union-attr]


def test_a_waiting_run_left_claimable_by_a_crash_is_parked_with_its_true_entry(tmp_path: Path) -> None:
    """A run waiting for a signal whose entry a crash left runnable is claimed once and then waits in the index."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("wait", 1, lambda req: WaitForSignal("ok", new_signal_token(), timeout_ms=3_600_000))
    runtime = WorkflowRuntime(url, reg)
    handle = runtime.start(chain("parked", "wait@1"))
    serve_until(Worker(url, reg, poll_interval_ms=20), lambda log: bool(events(log, "parked")))
    assert runtime.journal.index_get(handle.run_id).status is IndexStatus.WAITING  # type: ignore[union-attr]
    _left_runnable(runtime, handle.run_id)
    began = time.monotonic()
    log = serve_until(Worker(url, reg, poll_interval_ms=20), lambda log: time.monotonic() - began > 0.5)
    assert len(events(log, "claimed")) == 1  # not once per poll
    entry = runtime.journal.index_get(handle.run_id)
    assert entry is not None and entry.status is IndexStatus.WAITING and entry.ready_at_ms is not None


def test_runs_the_worker_lacks_handlers_for_do_not_starve_a_worker_with_fewer_slots(tmp_path: Path) -> None:
    """Older runs this worker refuses (another worker has their handlers) do not keep it from the runs behind."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("known", 1, lambda req: Succeeded())
    runtime = WorkflowRuntime(url, reg)
    aliens = [runtime.start(chain(f"alien{i}", "missing@1")).run_id for i in range(3)]
    served = runtime.start(chain("known", "known@1"))
    log = serve_until(
        Worker(url, reg, poll_interval_ms=20, concurrency=1),
        lambda log: bool(events(log, "ended")),
        timeout=10.0,
    )
    assert served.status() == "succeeded"
    assert sorted(e["run_id"] for e in events(log, "refused")) == sorted(aliens)
    # Each refused run is leased once to learn it is not this worker's, then left to others at once.
    for alien in aliens:
        runtime.leases.acquire(alien, "another", 1_000).release()


def test_a_worker_says_once_when_more_refused_runs_come_first_than_it_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound of refused runs one poll skips, the worker says so once and names the fix (queues)."""
    monkeypatch.setattr("mayfly.worker._SKIP_AT_MOST", 2)
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("known", 1, lambda req: Succeeded())
    runtime = WorkflowRuntime(url, reg)
    for i in range(3):
        runtime.start(chain(f"alien{i}", "missing@1"))
    runtime.start(chain("known", "known@1"))
    began = time.monotonic()
    log = serve_until(
        Worker(url, reg, poll_interval_ms=20, concurrency=1), lambda log: time.monotonic() - began > 0.5
    )
    (said,) = [e for e in events(log, "error") if "lacks handlers" in e["error"]]
    assert "--queue" in said["error"] and said["skipped"] == 2


def test_a_worker_remembers_a_bounded_number_of_refused_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs a worker refused are remembered up to a bound, the oldest forgotten first (no unbounded growth)."""
    monkeypatch.setattr("mayfly.worker._REFUSED_KEPT", 2)
    worker = Worker(f"file://{tmp_path}/store?durability=write", HandlerRegistry())
    for run in ("r1", "r2", "r3"):
        worker._refuse(run)
    assert list(worker._refused) == ["r2", "r3"]


def test_a_worker_writes_no_extra_index_entry_for_runs_whose_appends_wrote_it(tmp_path: Path) -> None:
    """Runs the worker drives and ends get their entries from their appends alone (no extra write per run)."""
    url = f"file://{tmp_path}/store?durability=write"
    reg = HandlerRegistry()
    reg.register("ok", 1, lambda req: Succeeded())
    runtime = WorkflowRuntime(url, reg)
    for i in range(3):
        runtime.start(chain(f"plain{i}", "ok@1", "ok@1"))
    worker = Worker(url, reg, poll_interval_ms=20)
    puts: list[Any] = []
    put = worker.index.index_put
    worker.index.index_put = lambda entries: (puts.append(entries), put(entries))[1]  # type: ignore[method-assign]
    serve_until(worker, lambda log: len(events(log, "ended")) == 3)
    assert puts == []
