"""Simulator seed families with real processes: workers SIGKILLed mid-run, and K workers sharing runs.

A seed submits generated runs to a store (file, lmdb, postgres, redis) and
lets real :class:`mayfly.worker.Worker` processes (``python -m
mayfly_contract.sim._procs worker ...``) drive them. The parent never drives
a run: it only reads the journal, SIGKILLs workers at seeded moments (after
the store holds a seeded number of events, found by polling) and starts new
ones. Handlers append one fsynced line per invocation to an effect log
(run, node, attempt, attempt id, idempotency key, which worker process).

At the end every run must have succeeded with the same outputs as a
fault-free run of the same workload on ``memory://``, and the journal and the
effect log must satisfy the simulator's invariants (see :func:`check`):
nothing the parent once read is gone, attempts are numbered 1..n without gap
or repeat, one outcome per attempt, re-invocations keep the attempt id and
idempotency key, an attempt whose outcome was seen committed is never invoked
again by a later worker, and a queue's concurrency limit is never exceeded.

Families (each ``(seed, backend, workdir) -> FamilyResult``):

* :func:`sigkill_seed`: one worker at a time, SIGKILLed 1-3 times;
* :func:`workers_seed`: K workers at once, seeded SIGKILLs; on PostgreSQL
  and Redis each worker reaches the store through its own fault proxy, and a
  seeded worker is partitioned (its proxy drops everything) past its lease,
  then healed: it must be fenced and let its runs go.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from mayfly import (
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    RetryableFailure,
    RetryPolicy,
    Succeeded,
    WorkflowSpec,
)
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted, RunCompleted
from mayfly.model.outcomes import NodeOutcome
from mayfly.queues import QUEUE_CONTROL, QueueSettings
from mayfly.reducer import decode_event
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker, json_log
from mayfly_contract.sim._servers import private_server

TTL_MS: Final = 1_000
"""Lease TTL of the simulator's workers: a SIGKILLed worker's runs are free again after a second."""
POLL_MS: Final = 100
QUEUE: Final = "sim"
FINISH_S: Final = 90.0
"""How long a seed waits for every run to end after its last fault."""

# -- the workload --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one seed runs: a generated DAG of ``sim.step@1`` nodes and one input per run."""

    seed: int
    spec: WorkflowSpec
    inputs: tuple[dict[str, Any], ...]


def workload(seed: int, runs: int | None = None) -> Workload:
    """The seed's workload: 3-6 nodes, each after up to two earlier ones; some fail their first attempts."""
    rng = random.Random(f"procs-workload-{seed}")
    count = rng.randint(3, 6)
    nodes = []
    for index in range(count):
        earlier = [f"n{j}" for j in range(index)]
        depends = tuple(sorted(rng.sample(earlier, min(len(earlier), rng.randint(1, 2))))) if earlier else ()
        node_input = {"fail_first": rng.choice([0, 0, 0, 1, 2]), "sleep_ms": rng.randint(5, 40)}
        retry = RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=rng.choice([0, 20, 150])))
        nodes.append(
            Node(f"n{index}", handler="sim.step@1", depends_on=depends, input=node_input, retry=retry)
        )
    spec = WorkflowSpec(workflow_id=f"sim.procs.s{seed}", version=1, nodes=tuple(nodes))
    total = rng.randint(2, 5) if runs is None else runs
    return Workload(seed, spec, tuple({"x": rng.randint(0, 10**6), "n": n} for n in range(total)))


def value(run_input: Any, node_id: str, inputs: Sequence[Any]) -> str:
    """A node's output value: a digest of the run input, the node and its prerequisites' values."""
    digest = hashlib.sha256(json.dumps([run_input, node_id, list(inputs)], sort_keys=True).encode())
    return digest.hexdigest()[:16]


class EffectLog:
    """The handlers' effect log: JSON lines appended and fsynced when an invocation begins and ends."""

    def __init__(self, path: Path, worker: int) -> None:
        self.path = path
        self.worker = worker

    def write(self, entry: dict[str, Any]) -> None:
        line = (
            json.dumps({**entry, "worker": self.worker, "t": time.monotonic()}, sort_keys=True) + "\n"
        ).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def registry(effects: EffectLog | None) -> HandlerRegistry:
    """The workload's handlers; with ``effects``, each invocation is logged before it returns."""
    handlers = HandlerRegistry()

    @handlers.handler("sim.step", version=1)
    def step(request: HandlerRequest) -> Succeeded | RetryableFailure:
        node_input = request.input if isinstance(request.input, dict) else {}
        entry = {
            "run": request.run_id,
            "node": request.node_id,
            "attempt": request.attempt,
            "attempt_id": request.attempt_id,
            "key": request.idempotency_key,
        }
        if effects is not None:
            effects.write({**entry, "ev": "begin"})
            time.sleep(int(node_input.get("sleep_ms", 0)) / 1000)
        try:
            if request.attempt <= int(node_input.get("fail_first", 0)):
                return RetryableFailure(reason=f"seeded failure of attempt {request.attempt}")
            upstream = [request.output_of(node)["v"] for node in sorted(request.dependencies)]
            return Succeeded(output={"v": value(request.run_input, request.node_id, upstream)})
        finally:
            if effects is not None:
                effects.write({**entry, "ev": "end"})

    return handlers


def fault_free(work: Workload) -> list[tuple[str, dict[str, Any]]]:
    """Each run's result and succeeded outputs in a fault-free run of the workload on ``memory://``."""
    runtime = WorkflowRuntime(f"memory://simnet-fault-free-{uuid.uuid4().hex}", registry(None))
    expected = []
    for run_input in work.inputs:
        result = runtime.execute(work.spec, run_input)
        expected.append((result.status.value, dict(result.outputs)))
    return expected


# -- stores ------------------------------------------------------------------------------------

_SHARED_POSTGRES: Final = "postgresql://postgres@127.0.0.1:5432/test"


@dataclasses.dataclass
class Store:
    """Where a seed's runs live: a journal URL, and the server behind it when it is a network store."""

    backend: str
    url: str
    host: str | None = None  # HOST:PORT of the network server
    server: Any = None  # a RestartableServer this store may crash
    cleanup: Callable[[], None] = lambda: None


_PRIVATE: dict[str, Any] = {}


def _private(backend: str) -> Any:
    """One private server per backend for this process (initdb costs seconds), destroyed at exit."""
    if backend not in _PRIVATE:
        _PRIVATE[backend] = private_server(backend)
        atexit.register(_PRIVATE[backend].destroy)
    return _PRIVATE[backend]


def _drop_postgres_schema(url: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "mayfly_postgres", "drop", "--yes", url],
        capture_output=True,
        timeout=120,
        check=False,
    )


def open_store(backend: str, workdir: Path, *, restartable: bool = False) -> Store:
    """A fresh, empty store of ``backend`` under ``workdir``; schemas and prefixes are ``simnet_*``.

    PostgreSQL is the shared test server (``MAYFLY_TEST_POSTGRES_URL``) unless
    ``restartable`` asks for this process's private cluster; Redis is always a
    private AOF ``always`` server (durability needs one).
    """
    name = f"simnet_{uuid.uuid4().hex[:12]}"
    if backend == "file":
        return Store(backend, f"file://{workdir / 'journal'}")
    if backend == "lmdb":
        return Store(backend, f"lmdb://{workdir / 'lmdb'}")
    if backend == "postgres":
        if restartable:
            server = _private("postgres")
            base = server.url
        else:
            server, base = None, os.environ.get("MAYFLY_TEST_POSTGRES_URL", _SHARED_POSTGRES)
        url = f"{base}{'&' if '?' in base else '?'}schema={name}"
        host = base.split("@", 1)[-1].split("/", 1)[0]
        return Store(backend, url, host=host, server=server, cleanup=lambda: _drop_postgres_schema(url))
    if backend == "redis":
        server = _private("redis")
        host = server.url.split("//", 1)[1].split("/", 1)[0]
        return Store(backend, f"{server.url}?prefix={name}", host=host, server=server)
    raise ValueError(f"unknown backend {backend!r}; expected file, lmdb, postgres or redis")


def via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by a local proxy's port."""
    scheme, rest = url.split("://", 1)
    credentials, _, tail = rest.rpartition("@")
    path = tail.split("/", 1)[1] if "/" in tail else ""
    return f"{scheme}://{credentials + '@' if credentials else ''}127.0.0.1:{port}/{path}"


# -- worker processes --------------------------------------------------------------------------


class WorkerProcess:
    """One ``python -m mayfly_contract.sim._procs worker`` process and its JSON log."""

    def __init__(
        self, url: str, workdir: Path, number: int, *, concurrency: int, extra: Sequence[str] = ()
    ) -> None:
        self.number = number
        self.log = workdir / f"worker-{number}.log"
        self.owner = f"sim-worker-{number}"
        argv = [
            sys.executable,
            "-m",
            "mayfly_contract.sim._procs",
            "worker",
            url,
            str(workdir / "effects.jsonl"),
            str(number),
            "--concurrency",
            str(concurrency),
            *extra,
        ]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
        self.started = time.monotonic()

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if isinstance(record, dict):
                    found.append(record)
        return found

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=30)

    def tail(self) -> str:
        return " | ".join(self.log.read_text(errors="replace").splitlines()[-5:])


def worker_main(argv: Sequence[str]) -> int:
    """``worker URL EFFECTS NUMBER [--concurrency C] [--ttl-ms T] [--poll-ms P]``: serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m mayfly_contract.sim._procs worker")
    parser.add_argument("url")
    parser.add_argument("effects", type=Path)
    parser.add_argument("number", type=int)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ttl-ms", type=int, default=TTL_MS)
    parser.add_argument("--poll-ms", type=int, default=POLL_MS)
    arguments = parser.parse_args(argv)
    worker = Worker(
        arguments.url,
        registry(EffectLog(arguments.effects, arguments.number)),
        owner=f"sim-worker-{arguments.number}",
        lease_ttl_ms=arguments.ttl_ms,
        poll_interval_ms=arguments.poll_ms,
        concurrency=arguments.concurrency,
        grace_ms=5_000,
        log=json_log(sys.stderr),
    )
    return worker.serve()


# -- observing the journal ----------------------------------------------------------------------


class Observer:
    """The parent's view of the store: each run's records as last read, when each outcome was first seen."""

    def __init__(self, url: str, runs: Sequence[str]) -> None:
        self.runtime = WorkflowRuntime(url)
        self.runs = list(runs)
        self.seen: dict[str, list[tuple[int, str]]] = {run: [] for run in runs}
        self.violations: list[str] = []
        self.outcome_seen_before: dict[str, int] = {}  # attempt id -> highest worker number started before
        self.terminal: set[str] = set()

    def poll(self, started_workers: int) -> int:
        """Read every run again; record violations of "nothing read is lost"; the number of records."""
        total = 0
        for run in self.runs:
            records = self.runtime.journal.read(run)
            now = [(r.sequence, r.event_id) for r in records]
            before = self.seen[run]
            if now[: len(before)] != before:
                self.violations.append(
                    f"run {run}: records read earlier are gone or changed (had {len(before)}, now {len(now)})"
                )
            self.seen[run] = now
            total += len(now)
            for record in records[len(before) :]:
                event = decode_event(record.event_type, record.schema_version, record.payload)
                if isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                    self.outcome_seen_before.setdefault(event.attempt_id, started_workers)
                if isinstance(event, RunCompleted):
                    self.terminal.add(run)
        return total

    def done(self) -> bool:
        return len(self.terminal) == len(self.runs)

    def histories(self) -> dict[str, list[Any]]:
        return {
            run: [
                decode_event(r.event_type, r.schema_version, r.payload)
                for r in self.runtime.journal.read(run)
            ]
            for run in self.runs
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.runtime.journal.close()


def read_effects(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            found.append(json.loads(line))
    return found


# -- the invariants ----------------------------------------------------------------------------


def check(
    histories: dict[str, list[Any]],
    expected: Sequence[tuple[str, dict[str, Any]]],
    order: Sequence[str],
    effects: Sequence[dict[str, Any]],
    outcome_seen_before: dict[str, int],
    *,
    queue_limit: int | None = None,
    kills: dict[int, float] | None = None,
) -> list[str]:
    """The invariants over final histories and the effect log; one line per violation."""
    violations: list[str] = []
    started_by_id: dict[str, NodeStarted] = {}
    for position, run in enumerate(order):
        events = histories[run]
        completed = [e for e in events if isinstance(e, RunCompleted)]
        if len(completed) != 1:
            violations.append(f"run {run}: {len(completed)} RunCompleted events")
            continue
        outputs: dict[str, Any] = {}
        per_node: dict[str, list[NodeStarted]] = collections.defaultdict(list)
        outcomes: dict[str, list[NodeOutcome]] = collections.defaultdict(list)
        for event in events:
            if isinstance(event, NodeStarted):
                per_node[event.node_id].append(event)
                if event.attempt_id in started_by_id:
                    violations.append(
                        f"run {run} node {event.node_id}: attempt id {event.attempt_id} started twice"
                    )
                started_by_id[event.attempt_id] = event
            elif isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                outcomes[event.attempt_id].append(event.outcome)
                if isinstance(event.outcome, Succeeded):
                    outputs[event.node_id] = event.outcome.output
        for node, starts in per_node.items():
            numbers = [s.attempt for s in starts]
            if numbers != list(range(1, len(numbers) + 1)):
                violations.append(
                    f"run {run} node {node}: attempts numbered {numbers}, not 1..{len(numbers)}"
                )
        for attempt_id, committed in outcomes.items():
            if len(committed) > 1:
                violations.append(f"run {run}: attempt {attempt_id} has {len(committed)} terminal outcomes")
            if attempt_id not in started_by_id:
                violations.append(f"run {run}: outcome for attempt {attempt_id} that never started")
        result = completed[0].result
        status, want = expected[position]
        got = str(result)
        if got != status or outputs != want:
            violations.append(
                f"run {run}: ended {got} with {outputs}, the fault-free run ended {status} with {want}"
            )
    keys: dict[str, str] = {}
    for effect in effects:
        if effect.get("ev") != "begin":
            continue
        attempt_id, key = effect["attempt_id"], effect["key"]
        start = started_by_id.get(attempt_id)
        if start is None or start.node_id != effect["node"] or start.attempt != effect["attempt"]:
            violations.append(
                f"effect of attempt {attempt_id} (node {effect['node']}) matches no NodeStarted"
            )
        if keys.setdefault(attempt_id, key) != key:
            violations.append(f"attempt {attempt_id} was re-invoked with another idempotency key")
        seen_before = outcome_seen_before.get(attempt_id)
        if seen_before is not None and effect["worker"] >= seen_before:
            violations.append(
                f"attempt {attempt_id} (run {effect['run']} node {effect['node']}) was invoked again by "
                f"worker {effect['worker']}, started after its outcome was committed"
            )
    if queue_limit is not None:
        violations.extend(_queue_limit(effects, queue_limit, kills or {}))
    return violations


def _queue_limit(effects: Sequence[dict[str, Any]], limit: int, kills: dict[int, float]) -> list[str]:
    """At most ``limit`` handlers in flight at once (a killed worker's invocations end at the kill)."""
    spans: dict[tuple[int, str], list[float]] = {}
    moments: list[tuple[float, int, str]] = []
    for effect in effects:
        slot = (effect["worker"], effect["attempt_id"])
        if effect["ev"] == "begin":
            spans.setdefault(slot, [effect["t"], float("inf")])
        elif slot in spans:
            spans[slot][1] = effect["t"]
    for (worker, _), (begin, finish) in spans.items():
        moments.append((begin, 1, f"{worker}"))
        moments.append((min(finish, kills.get(worker, float("inf"))), -1, f"{worker}"))
    active = 0
    peak = 0
    for _, delta, _ in sorted(moments, key=lambda m: (m[0], m[1])):
        active += delta
        peak = max(peak, active)
    return (
        [f"{peak} runs of queue {QUEUE} ran at once, its concurrency limit is {limit}"]
        if peak > limit
        else []
    )


# -- families -----------------------------------------------------------------------------------


@dataclasses.dataclass
class FamilyResult:
    """One seed of a family: its violations (empty: it passed), a one-line account and its duration."""

    violations: list[str]
    detail: str
    seconds: float


@contextlib.contextmanager
def seed_dir(workdir: Path | None, family: str, seed: int) -> Iterator[Path]:
    parent = workdir or Path(tempfile.gettempdir()) / "simnet"
    parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=f"{family}-{seed}-", dir=parent))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def submit(store: Store, work: Workload, *, queue_limit: int | None = None) -> list[str]:
    """Create the workload's runs (nothing drives them yet); set the queue's limit when given."""
    runtime = WorkflowRuntime(store.url)
    try:
        if queue_limit is not None:
            control = QUEUE_CONTROL.of(runtime.journal)
            assert control is not None, f"{store.url} has no queue control"
            control.queue_set(QueueSettings(name=QUEUE, concurrency=queue_limit))
        return [runtime.start(work.spec, run_input, queue=QUEUE).run_id for run_input in work.inputs]
    finally:
        runtime.journal.close()


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _moment(observer: Observer, started: int, target: int, worker: WorkerProcess) -> Callable[[], bool]:
    """When to SIGKILL: the store holds ``target`` records, or every run ended, or the worker died."""
    return lambda: observer.poll(started) >= target or observer.done() or not worker.alive()


def sigkill_seed(seed: int, backend: str, workdir: Path | None = None) -> FamilyResult:
    """One worker at a time drives the seed's runs; it is SIGKILLed 1-3 times after seeded event counts."""
    began = time.monotonic()
    rng = random.Random(f"sigkill-{seed}-{backend}")
    work = workload(seed)
    expected = fault_free(work)
    with seed_dir(workdir, "sigkill", seed) as directory:
        store = open_store(backend, directory)
        try:
            runs = submit(store, work)
            observer = Observer(store.url, runs)
            workers: list[WorkerProcess] = []
            kills = rng.randint(1, 3)
            killed = 0
            try:
                for _ in range(kills + 1):
                    worker = WorkerProcess(
                        store.url, directory, len(workers), concurrency=rng.choice([1, 4, 8])
                    )
                    workers.append(worker)
                    if killed == kills:
                        break
                    target = observer.poll(len(workers)) + rng.randint(1, 12)
                    reached = wait_until(_moment(observer, len(workers), target, worker), 60)
                    if not worker.alive():
                        observer.violations.append(
                            f"worker {worker.number} exited on its own: {worker.tail()}"
                        )
                        break
                    if observer.done() or not reached:
                        break
                    worker.kill()
                    killed += 1
                finished = wait_until(lambda: observer.poll(len(workers)) >= 0 and observer.done(), FINISH_S)
                if not finished:
                    observer.violations.append(
                        f"{len(runs) - len(observer.terminal)} of {len(runs)} runs did not end within "
                        f"{FINISH_S} s of the last SIGKILL; last worker: {workers[-1].tail()}"
                    )
                observer.poll(len(workers))
                violations = list(observer.violations)
                if finished:
                    violations += check(
                        observer.histories(),
                        expected,
                        runs,
                        read_effects(directory / "effects.jsonl"),
                        observer.outcome_seen_before,
                    )
                status = workers[-1].stop()
                if status != 0 and not violations:
                    violations.append(f"the last worker exited {status} on SIGTERM: {workers[-1].tail()}")
            finally:
                for worker in workers:
                    worker.kill()
                observer.close()
        finally:
            store.cleanup()
    detail = f"sigkill {backend}: {len(runs)} runs of {len(work.spec.nodes)} nodes, {killed} SIGKILLs"
    return FamilyResult(violations, detail, time.monotonic() - began)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["worker"]:
        return worker_main(arguments[1:])
    parser = argparse.ArgumentParser(
        prog="python -m mayfly_contract.sim._procs", description="Run one seed of a process family."
    )
    parser.add_argument("family", choices=["sigkill", "workers"])
    parser.add_argument("--backend", default="file", choices=["file", "lmdb", "postgres", "redis"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=3)
    parsed = parser.parse_args(arguments)
    if parsed.family == "sigkill":
        result = sigkill_seed(parsed.seed, parsed.backend)
    else:
        result = workers_seed(parsed.seed, parsed.backend, workers=parsed.workers)
    lines = [f"{result.detail}: {len(result.violations)} violations in {result.seconds:.2f} s"]
    lines += [f"  {violation}" for violation in result.violations]
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if result.violations else 0


def workers_seed(seed: int, backend: str, workdir: Path | None = None, *, workers: int = 3) -> FamilyResult:
    raise NotImplementedError


if __name__ == "__main__":
    sys.exit(main())
