"""Simulator seed families with real processes: workers SIGKILLed mid-run, and K workers sharing runs.

A seed submits runs of ``mayfly.testing.generate_workflow``'s workflows to a
store (file, lmdb, postgres, redis) and lets real
:class:`mayfly.worker.Worker` processes (:func:`worker_main`, with
``sim_registry``'s handlers) drive them. The parent never drives a run: it
reads the store, SIGKILLs workers at seeded moments (once the store holds a
seeded number of records more) and starts new ones. Every worker's handlers
and journal append each invocation and each acknowledged append to one
fsynced effect log (:class:`FileEffects`).

Between faults and at the end, ``mayfly.testing.check_invariants`` checks
the store against that log and what the parent read: nothing acknowledged
lost, one outcome per attempt, re-invocations under the started attempt id
and its idempotency key, none after the attempt's success was acknowledged,
and at the end every run's result equal to its fault-free run's
(``SimDriver`` on ``memory://``). :func:`attempt_numbering` adds that
attempts are numbered 1..n in each activation, without gap or repeat, and
the workers family that a queue's concurrency limit is never exceeded.

Families (the campaign driver's ``--family sigkill|workers``):

* :func:`sigkill_seed`: one worker at a time, SIGKILLed 1-3 times;
* :func:`workers_seed`: K workers at once, seeded SIGKILLs; on PostgreSQL
  and Redis each worker reaches the store through its own fault proxy, and a
  seeded worker is partitioned (its proxy drops everything) past its lease,
  then healed: it must let go of the runs the others took.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import dataclasses
import functools
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
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from mayfly import FixedBackoff, HandlerRequest, Succeeded, WorkflowSpec, plugins
from mayfly.journal import JournalRecord, WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.events import ChildStarted, EdgeActivated, NodeOutcomeCommitted, NodeReady, NodeStarted
from mayfly.queues import QUEUE_CONTROL, QueueSettings
from mayfly.reducer import decode_event
from mayfly.runtime import WorkflowRuntime
from mayfly.testing import (
    EffectLog,
    ExpectedRun,
    FaultJournal,
    FaultPlan,
    GeneratedWorkflow,
    Invocation,
    MemoryStore,
    SimDriver,
    Violation,
    check_invariants,
    expected_of,
    generate_workflow,
    sim_registry,
)
from mayfly.worker import Worker, json_log
from mayfly_contract.sim._context import SeedContext, SeedResult
from mayfly_contract.sim._servers import private_server

if TYPE_CHECKING:
    # Imported where used: ``python -m mayfly_contract.sim._netproxy`` imports this package first, and a
    # module the package already imported would run twice (runpy warns).
    from mayfly_contract.sim._netproxy import NetProxy

PROCESS_BACKENDS: Final = frozenset({"file", "lmdb", "postgres", "redis"})
"""The backends the process families run on (every backend several worker processes may share)."""
TTL_MS: Final = 1_000
"""Lease TTL of the simulator's workers: a SIGKILLed worker's runs are free again after a second."""
POLL_MS: Final = 100
QUEUE: Final = "sim"
FINISH_S: Final = 90.0
"""How long a seed waits for every run to end after its last fault."""

# -- the workload --------------------------------------------------------------------------------

_LONGEST_BACKOFF_MS: Final = 200


def _real_time(spec: WorkflowSpec) -> WorkflowSpec:
    """``spec`` with fixed backoffs over 200 ms cut to 200 ms: workers wait real (wall-clock) time."""
    nodes = []
    for node in spec.nodes:
        backoff = node.retry.backoff
        if isinstance(backoff, FixedBackoff) and backoff.delay_ms > _LONGEST_BACKOFF_MS:
            retry = msgspec.structs.replace(node.retry, backoff=FixedBackoff(_LONGEST_BACKOFF_MS))
            nodes.append(msgspec.structs.replace(node, retry=retry))
        else:
            nodes.append(node)
    return msgspec.structs.replace(spec, nodes=tuple(nodes))


def workload(seed: int, runs: int | None = None) -> list[GeneratedWorkflow]:
    """The seed's runs: 2-4 of ``mayfly.testing.generate_workflow``'s workflows, without signal waits.

    Nothing here delivers signals (the workers run on wall-clock time), and a
    retry waits at most 200 ms; otherwise the workflows are the generator's:
    fan-out and fan-in, flaky nodes with retries, correction loops, permanent
    failures, child runs.
    """
    rng = random.Random(f"procs-workload-{seed}")
    count = rng.randint(2, 4) if runs is None else runs
    drawn = [generate_workflow(rng, signals=False) for _ in range(count)]
    return [msgspec.structs.replace(w, spec=_real_time(w.spec)) for w in drawn]


def _opener(store: MemoryStore) -> Callable[[], tuple[WorkflowJournal, RecoveryLeaseStore]]:
    return lambda: (store.journal(), store.leases())


def fault_free(work: Sequence[GeneratedWorkflow]) -> list[ExpectedRun]:
    """Each run's fault-free result: :class:`mayfly.testing.SimDriver` on a fresh memory store, no faults."""
    expected = []
    for n, generated in enumerate(work):
        store = MemoryStore(f"simnet-fault-free-{uuid.uuid4().hex}")
        driver = SimDriver(_opener(store), sim_registry(EffectLog()))
        try:
            result = driver.run(generated.spec, generated.input, str(uuid.UUID(int=n + 1)), generated.events)
        finally:
            driver.close()
        expected.append(expected_of(result))
    return expected


class FileEffects(EffectLog):
    """The simulator's :class:`mayfly.testing.EffectLog`, kept in a file shared by worker processes.

    Each invocation, its return and each acknowledged append is one JSON
    line, appended and fsynced before the worker goes on, stamped with
    ``time.monotonic_ns()`` (one clock for every process on the machine), so
    the parent rebuilds one :class:`EffectLog` from every worker's lines
    (:func:`read_effects`) and orders invocations against acknowledgements.
    """

    def __init__(self, path: Path, worker: int) -> None:
        super().__init__()
        self.path = path
        self.worker = worker
        self._count = 0

    def _write(self, record: dict[str, Any]) -> None:
        line = (json.dumps({**record, "w": self.worker, "t": time.monotonic_ns()}) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def invoked(self, req: HandlerRequest) -> int:
        with self._lock:
            self._count += 1
            index = self._count
        entry = [req.run_id, req.node_id, req.attempt_id, req.idempotency_key, req.attempt]
        self._write({"k": "invoked", "i": index, "a": entry})
        return index

    def returned(self, index: int, outcome: object) -> None:
        try:
            text = msgspec.json.encode(outcome).decode()
        except TypeError:
            text = repr(outcome)
        self._write({"k": "returned", "i": index, "o": text})

    def acknowledged(self, run_id: str, records: Sequence[JournalRecord]) -> None:
        successes = []
        for record in records:
            if record.event_type == "NodeOutcomeCommitted":
                event = decode_event(record.event_type, record.schema_version, record.payload)
                if isinstance(event, NodeOutcomeCommitted) and isinstance(event.outcome, Succeeded):
                    successes.append(event.attempt_id)
        acked = [[record.sequence, record.checksum] for record in records]
        self._write({"k": "acked", "run": run_id, "r": acked, "s": successes})


def read_effects(
    path: Path, seen: dict[str, list[str]] | None = None
) -> tuple[EffectLog, dict[str, list[str]]]:
    """Every worker's effect lines as one :class:`EffectLog`, and each run's acknowledged checksums.

    ``seen`` adds what the parent itself read from the store (committed:
    acknowledged to a reader). A line cut short by a SIGKILL is ignored.
    """
    effects = EffectLog()
    acked: dict[str, dict[int, str]] = {run: dict(enumerate(sums, 1)) for run, sums in (seen or {}).items()}
    lines = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(line))
    returned = {(r["w"], r["i"]): r["o"] for r in lines if r["k"] == "returned"}
    for record in sorted(lines, key=lambda r: int(r["t"])):
        if record["k"] == "invoked":
            run_id, node_id, attempt_id, key, attempt = record["a"]
            invocation = Invocation(
                tick=int(record["t"]),
                run_id=run_id,
                node_id=node_id,
                attempt_id=attempt_id,
                idempotency_key=key,
                attempt=attempt,
                outcome=returned.get((record["w"], record["i"]), ""),
            )
            effects.invocations.append(invocation)
        elif record["k"] == "acked":
            stored = acked.setdefault(record["run"], {})
            for sequence, checksum in record["r"]:
                stored.setdefault(sequence, checksum)
            for attempt_id in record["s"]:
                effects.success_ticks.setdefault(attempt_id, int(record["t"]))
    in_order = {}
    for run, stored in acked.items():
        sums: list[str] = []
        while len(sums) + 1 in stored:
            sums.append(stored[len(sums) + 1])
        in_order[run] = sums
    return effects, in_order


# -- observing the journal ----------------------------------------------------------------------


class Observer:
    """The parent's view of the store: each run's records as last read, and the workers' claims."""

    def __init__(self, url: str, runs: Sequence[str]) -> None:
        self.runtime = WorkflowRuntime(url)
        self.runs = list(runs)
        self.seen: dict[str, list[str]] = {run: [] for run in runs}
        self.terminal: set[str] = set()
        self.violations: list[Violation] = []
        self.checked = (0, 0)
        """How many invocations and acknowledged records :func:`check` checked."""

    def poll(self) -> int:
        """Read every unfinished run again (keeping the longest history read); the number of records."""
        total = 0
        for run in self.runs:
            if run not in self.terminal:
                records = self.runtime.journal.read(run)
                if len(records) >= len(self.seen[run]):
                    self.seen[run] = [r.checksum for r in records]
                if any(r.event_type == "RunCompleted" for r in records):
                    self.terminal.add(run)
            total += len(self.seen[run])
        return total

    def done(self) -> bool:
        return len(self.terminal) == len(self.runs)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.runtime.journal.close()
        with contextlib.suppress(Exception):
            self.runtime.leases.close()


def held(events: Sequence[dict[str, Any]]) -> set[str]:
    """The runs a worker's log says it holds: claimed, and not yet ended, parked, lost, refused or failed."""
    holding: set[str] = set()
    for event in events:
        run = event.get("run_id")
        if not isinstance(run, str):
            continue
        if event.get("event") == "claimed":
            holding.add(run)
        elif event.get("event") in ("ended", "parked", "lost", "refused", "error"):
            holding.discard(run)
    return holding


def check(
    store: Store,
    runs: Sequence[str],
    expected: Sequence[ExpectedRun] | None,
    effects_path: Path,
    observer: Observer,
) -> list[Violation]:
    """``mayfly.testing.check_invariants`` on the store, with every worker's effects and acknowledgements.

    ``expected`` ``None`` is a check between faults, while runs are in progress: everything but the
    terminal results (the effect log is read before the store, so every invocation's start and every
    acknowledged record it names were committed before the store is read).
    """
    effects, acknowledged = read_effects(effects_path, observer.seen)
    observer.checked = (len(effects.invocations), sum(len(sums) for sums in acknowledged.values()))
    wanted = dict.fromkeys(runs) if expected is None else dict(zip(runs, expected, strict=True))
    return check_invariants(
        observer.runtime.journal,
        wanted,
        acknowledged={**acknowledged, **{run: acknowledged.get(run, []) for run in runs}},
        effects=effects,
        require_terminal=expected is not None,
    )


class _Reads(Protocol):
    def read(self, run_id: str) -> Sequence[JournalRecord]: ...


def attempt_numbering(journal: _Reads, runs: Sequence[str]) -> list[Violation]:
    """Each node's attempts are numbered 1, 2, ... per activation (ready again, or an edge into it: 1).

    Child runs are checked with their parents. A gap (1, 3), a repeat (1, 1 with no new activation) or a
    start that is neither is a violation.
    """
    violations: list[Violation] = []
    pending = list(runs)
    while pending:
        run = pending.pop()
        last: dict[str, int] = {}
        ready: set[str] = set()
        for record in journal.read(run):
            event = decode_event(record.event_type, record.schema_version, record.payload)
            if isinstance(event, NodeReady):
                ready.add(event.node_id)
            elif isinstance(event, EdgeActivated):
                ready.add(event.target)  # a correction loop: a new activation
            elif isinstance(event, NodeStarted | ChildStarted):
                if isinstance(event, ChildStarted):
                    pending.append(event.child_run_id)
                before = last.get(event.node_id)
                due = 1 if before is None or event.node_id in ready else before + 1
                if event.attempt != due:
                    violations.append(
                        Violation(
                            "attempt_numbering",
                            run,
                            f"{event.node_id} started attempt {event.attempt} after attempt {before}",
                        )
                    )
                last[event.node_id] = event.attempt
                ready.discard(event.node_id)
    return violations


def interim(observer: Observer, store: Store, runs: Sequence[str], directory: Path) -> None:
    """Check the invariants between faults; keep each violation once (the final check may see it again)."""
    for violation in check(store, runs, None, directory / "effects.jsonl", observer):
        if violation not in observer.violations:
            observer.violations.append(violation)


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


_WORKER_MAIN: Final = (
    "import sys; from mayfly_contract.sim._procs import worker_main; sys.exit(worker_main(sys.argv[1:]))"
)


class WorkerProcess:
    """One worker process (:func:`worker_main`) and its JSON log."""

    def __init__(
        self, url: str, workdir: Path, number: int, *, concurrency: int, extra: Sequence[str] = ()
    ) -> None:
        self.number = number
        self.log = workdir / f"worker-{number}.log"
        self.owner = f"sim-worker-{number}"
        argv = [
            sys.executable,
            "-c",
            _WORKER_MAIN,
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
    """A simulator worker process: ``URL EFFECTS NUMBER [--concurrency C] [--ttl-ms T] [--poll-ms P]``.

    A real :class:`mayfly.worker.Worker` with :func:`mayfly.testing.sim_registry`'s
    handlers, serving until SIGTERM; its journal reports every acknowledged
    append, and its handlers every invocation, to the shared effect log.
    """
    parser = argparse.ArgumentParser(prog="simulator worker")
    parser.add_argument("url")
    parser.add_argument("effects", type=Path)
    parser.add_argument("number", type=int)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ttl-ms", type=int, default=TTL_MS)
    parser.add_argument("--poll-ms", type=int, default=POLL_MS)
    arguments = parser.parse_args(argv)
    effects = FileEffects(arguments.effects, arguments.number)
    journal = plugins.open_journal(arguments.url)
    worker = Worker(
        # The fault journal injects nothing here: it reports every acknowledged append to the effect log.
        FaultJournal(journal, FaultPlan(), effects),
        sim_registry(effects),
        leases=plugins.open_leases(arguments.url),
        owner=f"sim-worker-{arguments.number}",
        lease_ttl_ms=arguments.ttl_ms,
        poll_interval_ms=arguments.poll_ms,
        concurrency=arguments.concurrency,
        grace_ms=5_000,
        log=json_log(sys.stderr),
    )
    return worker.serve()


# -- families -----------------------------------------------------------------------------------


@dataclasses.dataclass
class FamilyResult:
    """One seed of a family: its violations (empty: it passed), a one-line account and its duration."""

    violations: list[Violation]
    detail: str
    seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the seed saw that is no violation (a worker that gave up with a typed error, say)."""
    faults: dict[str, int] = dataclasses.field(default_factory=dict)
    """How many faults of each kind the seed applied."""


@contextlib.contextmanager
def seed_dir(workdir: Path | None, family: str, seed: int) -> Iterator[Path]:
    """A fresh directory for one seed (under ``workdir``, default ``$TMPDIR/simnet``), removed afterwards."""
    parent = workdir or Path(tempfile.gettempdir()) / "simnet"
    parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=f"{family}-{seed}-", dir=parent))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def submit(store: Store, work: Sequence[GeneratedWorkflow], *, queue_limit: int | None = None) -> list[str]:
    """Create the workload's runs on queue ``sim`` (nothing drives them yet), after setting its limit."""
    runtime = WorkflowRuntime(store.url)
    try:
        if queue_limit is not None:
            control = QUEUE_CONTROL.of(runtime.journal)
            assert control is not None, f"{store.url} has no queue control"
            control.queue_set(QueueSettings(name=QUEUE, concurrency=queue_limit))
        return [runtime.start(w.spec, w.input, queue=QUEUE).run_id for w in work]
    finally:
        runtime.journal.close()
        runtime.leases.close()


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` every 20 ms; whether it held within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Fleet:
    """The seed's worker processes, numbered in start order, and what the parent did to them."""

    def __init__(self, store: Store, directory: Path, rng: random.Random) -> None:
        self.store = store
        self.directory = directory
        self.rng = rng
        self.workers: list[WorkerProcess] = []
        self.killed: set[int] = set()
        self.exits: list[str] = []
        self.connect: Callable[[], str] | None = None
        """The URL each new worker gets (a proxy of its own, say); the store's URL when ``None``."""

    def start(self) -> WorkerProcess:
        slots = self.rng.choice([1, 4, 8])
        url = self.store.url if self.connect is None else self.connect()
        worker = WorkerProcess(url, self.directory, len(self.workers), concurrency=slots)
        self.workers.append(worker)
        return worker

    def kill(self, worker: WorkerProcess) -> None:
        worker.kill()
        self.killed.add(worker.number)

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.number not in self.killed and w.alive()]

    def reap(self) -> list[WorkerProcess]:
        """Workers that exited by themselves (recorded once each)."""
        gone = [w for w in self.workers if w.number not in self.killed and not w.alive()]
        for worker in gone:
            self.killed.add(worker.number)
            self.exits.append(f"worker {worker.number} exited {worker.process.returncode}: {worker.tail()}")
        return gone

    def stop(self) -> list[str]:
        """SIGTERM every live worker; the ones that did not exit 0."""
        bad = []
        for worker in self.live():
            # A worker SIGTERMed before it installed its handlers would die of the signal: let it start.
            wait_until(functools.partial(_started, worker), 60)
            status = worker.stop()
            if status != 0:
                bad.append(f"worker {worker.number} exited {status} on SIGTERM: {worker.tail()}")
        return bad

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()


def _started(worker: WorkerProcess) -> bool:
    return not worker.alive() or any(event.get("event") == "started" for event in worker.events())


def finish(observer: Observer, fleet: Fleet, restart: bool = True) -> bool:
    """Wait until every run ended (starting a worker when none is alive); whether they did in time."""

    def ended() -> bool:
        observer.poll()
        fleet.reap()
        if restart and not fleet.live():
            fleet.start()
        return observer.done()

    return wait_until(ended, FINISH_S)


def verdict(
    store: Store,
    runs: Sequence[str],
    *,
    expected: Sequence[ExpectedRun],
    observer: Observer,
    fleet: Fleet,
    finished: bool,
) -> list[Violation]:
    """The seed's violations: unfinished runs, then :func:`check` once the workers stopped."""
    violations = list(observer.violations)
    if not finished:
        left = len(runs) - len(observer.terminal)
        last = fleet.workers[-1].tail() if fleet.workers else "no worker"
        violations.append(
            Violation("not_terminal", "", f"{left} of {len(runs)} runs did not end; last: {last}")
        )
    violations += [Violation("worker_exit", "", message) for message in fleet.stop()]
    final = check(store, runs, expected, fleet.directory / "effects.jsonl", observer)
    final += attempt_numbering(observer.runtime.journal, runs)
    violations += [violation for violation in final if violation not in violations]
    return violations


def _moment(observer: Observer, target: int, worker: WorkerProcess) -> Callable[[], bool]:
    """When to SIGKILL: the store holds ``target`` records, every run ended, or the worker died."""
    return lambda: observer.poll() >= target or observer.done() or not worker.alive()


def sigkill_seed(seed: int, backend: str, workdir: Path | None = None) -> FamilyResult:
    """One worker at a time drives the seed's runs; it is SIGKILLed 1-3 times after seeded record counts."""
    began = time.monotonic()
    rng = random.Random(f"sigkill-{seed}-{backend}")
    work = workload(seed)
    expected = fault_free(work)
    kills = rng.randint(1, 3)
    with seed_dir(workdir, "sigkill", seed) as directory:
        store = open_store(backend, directory)
        fleet = Fleet(store, directory, rng)
        try:
            runs = submit(store, work)
            observer = Observer(store.url, runs)
            try:
                for _ in range(kills):
                    worker = fleet.start()
                    target = observer.poll() + rng.randint(1, 12)
                    wait_until(_moment(observer, target, worker), 60)
                    if observer.done():
                        break
                    if worker.alive():
                        fleet.kill(worker)
                        interim(observer, store, runs, directory)
                    else:
                        fleet.reap()
                finished = finish(observer, fleet)
                violations = verdict(
                    store, runs, expected=expected, observer=observer, fleet=fleet, finished=finished
                )
                violations += [Violation("worker_exit", "", message) for message in fleet.exits]
            finally:
                observer.close()
        finally:
            fleet.close()
            store.cleanup()
    nodes = sum(len(w.spec.nodes) for w in work)
    detail = (
        f"sigkill {backend}: {len(runs)} runs, {nodes} nodes, {len(fleet.killed)} SIGKILLs; checked "
        f"{observer.checked[0]} invocations, {observer.checked[1]} acknowledged records"
    )
    return FamilyResult(violations, detail, time.monotonic() - began, faults={"sigkill": len(fleet.killed)})


def _partition(fleet: Fleet, victim: WorkerProcess, proxy: NetProxy, pause: float) -> list[Violation]:
    """Cut ``victim`` off for ``pause`` seconds, heal; the runs others took meanwhile must be let go."""
    before = held(victim.events())
    others = {w.number: len(w.events()) for w in fleet.workers if w is not victim}
    proxy.drop()
    time.sleep(pause)
    proxy.heal()
    claimed = {
        e.get("run_id")
        for w in fleet.workers
        if w is not victim
        for e in w.events()[others.get(w.number, 0) :]
        if e.get("event") == "claimed"
    }
    taken = before & claimed

    def let_go() -> bool:
        return not victim.alive() or not held(victim.events()) & taken

    wait_until(let_go, 30)
    if victim.alive() and held(victim.events()) & taken:
        still = sorted(held(victim.events()) & taken)
        return [
            Violation("not_fenced", still[0], f"worker {victim.number} still holds runs others took: {still}")
        ]
    return []


def workers_seed(seed: int, backend: str, workdir: Path | None = None, *, workers: int = 3) -> FamilyResult:
    """``workers`` worker processes share the seed's runs under a queue limit; seeded SIGKILLs and partitions.

    On PostgreSQL and Redis each worker reaches the store through a fault
    proxy of its own; a partition drops everything on one worker's proxy for
    2.5-4 lease TTLs, so the others take its runs over, then heals it: it must
    be fenced, let those runs go and stay up. The queue's concurrency limit is
    checked at every poll against the runs in progress as the store counts them.
    """
    began = time.monotonic()
    rng = random.Random(f"workers-{seed}-{backend}-{workers}")
    work = workload(seed, runs=rng.randint(4, 8))
    expected = fault_free(work)
    limit = rng.randint(1, workers + 1)
    network = backend in ("postgres", "redis")
    faults = [rng.choice(["kill", "partition"] if network else ["kill"]) for _ in range(rng.randint(1, 3))]
    proxies: dict[int, NetProxy] = {}
    done: collections.Counter[str] = collections.Counter()
    with seed_dir(workdir, "workers", seed) as directory:
        store = open_store(backend, directory)
        fleet = Fleet(store, directory, rng)
        try:
            runs = submit(store, work, queue_limit=limit)
            observer = Observer(store.url, runs)
            peak = [0]

            def connect() -> str:
                assert store.host is not None
                from mayfly_contract.sim._netproxy import NetProxy  # noqa: PLC0415 - see TYPE_CHECKING above

                proxy = NetProxy(store.host, seed=rng.randrange(1 << 30), workdir=directory)
                proxies[len(fleet.workers)] = proxy
                return via(store.url, proxy.port)

            if network:
                fleet.connect = connect
            start = fleet.start

            control = QUEUE_CONTROL.of(observer.runtime.journal)
            assert control is not None

            def within_limit() -> bool:
                # Runs in progress as the store counts them (a dead or cut-off worker's runs count until
                # their leases expire): a claim that over-admits shows here.
                usage = control.queue_usage(QUEUE, now_ms=int(time.time() * 1000))
                peak[0] = max(peak[0], usage.in_progress)
                if usage.in_progress > limit:
                    observer.violations.append(
                        Violation(
                            "queue_limit",
                            "",
                            f"{usage.in_progress} runs of {QUEUE} in progress, limit {limit}",
                        )
                    )
                return True

            def progressed(target: int) -> bool:
                return within_limit() and (observer.poll() >= target or observer.done())

            try:
                for _ in range(workers):
                    start()
                for fault in faults:
                    target = observer.poll() + rng.randint(2, 15)
                    wait_until(functools.partial(progressed, target), 60)
                    live = fleet.live()
                    if observer.done() or not live:
                        break
                    victim = rng.choice(live)
                    if fault == "kill":
                        fleet.kill(victim)
                        start()
                    else:
                        pause = rng.uniform(2.5, 4.0) * TTL_MS / 1000
                        observer.violations += _partition(fleet, victim, proxies[victim.number], pause)
                    done[fault] += 1
                    interim(observer, store, runs, directory)
                finished = finish(observer, fleet)
                within_limit()
                violations = verdict(
                    store, runs, expected=expected, observer=observer, fleet=fleet, finished=finished
                )
                violations += [Violation("worker_exit", "", message) for message in fleet.exits]
            finally:
                observer.close()
        finally:
            fleet.close()
            for proxy in proxies.values():
                proxy.close()
            store.cleanup()
    detail = (
        f"workers {backend}: {len(runs)} runs over {workers} workers (queue limit {limit}, peak {peak[0]}), "
        f"{done['kill']} SIGKILLs, {done['partition']} partitions; checked {observer.checked[0]} "
        f"invocations, {observer.checked[1]} acknowledged records"
    )
    return FamilyResult(violations, detail, time.monotonic() - began, faults=dict(done))


def sigkill_family(ctx: SeedContext) -> SeedResult:
    """The ``sigkill`` family for the campaign driver (``--family sigkill``)."""
    return _seed_result("sigkill", sigkill_seed(ctx.seed, ctx.backend.name, ctx.backend.directory))


def workers_family(ctx: SeedContext) -> SeedResult:
    """The ``workers`` family for the campaign driver (``--workers K`` with K >= 2)."""
    found = workers_seed(ctx.seed, ctx.backend.name, ctx.backend.directory, workers=ctx.workers)
    return _seed_result("workers", found)


def _seed_result(family: str, found: FamilyResult) -> SeedResult:
    return SeedResult(
        family, found.violations, notes=[f"{found.detail} in {found.seconds:.1f} s", *found.notes]
    )
