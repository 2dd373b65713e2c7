"""The simulator's core: seeded workflows, a fault-injecting journal, a crash-and-recover driver, invariants.

Everything here is deterministic from one ``random.Random(seed)`` and a
:class:`~mayfly.substrate.VirtualClock`, and works on any journal (memory,
file, LMDB, PostgreSQL, Redis), so a failing seed replays exactly:

- :func:`generate_workflow` draws a workflow (fan-out and fan-in, retries with
  backoff, correction loops, child runs, signal waits with deadlines, a
  cancellation) as plain JSON data (:class:`GeneratedWorkflow`); its handlers
  all come from :func:`sim_registry`, which reads each node's behaviour from
  the node's ``input``, so another process rebuilds the same registry from
  nothing but the spec.
- :class:`FaultJournal` wraps a real journal and counts its mutating
  operations; a :class:`FaultPlan` makes it die (raise
  :class:`~mayfly.testing.SimulatedCrash`) before or after operation *k*, or
  fail one with a typed storage error. Handlers can die too, right after
  their effect (:class:`EffectLog`).
- :class:`SimDriver` drives one run to its end through those deaths: a dead
  runtime is abandoned, the backend reopened, and a new runtime (a new owner)
  recovers the run, as a restarted process would. The plan's signals,
  cancellation, wall-clock jumps and downtime happen at their virtual times.
- :func:`check_invariants` reads the journal afterwards and returns every
  broken guarantee as a :class:`Violation`.

The names in ``__all__`` are stable: the contract suite's driver
(``python -m mayfly_contract.sim``) and :func:`mayfly.testing.simulate` are
built on them.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from mayfly.journal import AppendResult, JournalRecord, SnapshotRecord, WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import CorruptionError, JournalUnavailable, MayflyError
from mayfly.model.events import (
    ChildStarted,
    Event,
    NodeOutcomeCommitted,
    NodeStarted,
    SignalAccepted,
    SignalExpired,
    SignalWaitOpened,
    VirtualTimeAdvanced,
)
from mayfly.model.ids import DeterministicIdSource, IdSource, idempotency_key
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import (
    ChangesRequested,
    NodeOutcome,
    NodeOutcomeKind,
    PermanentFailure,
    RetryableFailure,
    Succeeded,
)
from mayfly.model.signals import SignalToken
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    ExponentialBackoff,
    FixedBackoff,
    ImmediateBackoff,
    Node,
    OnOutcome,
    RetryPolicy,
    WorkflowSpec,
)
from mayfly.model.state import RunStatus
from mayfly.reducer import decode_event, replay
from mayfly.runtime import (
    HandlerRegistry,
    HandlerRequest,
    RunResult,
    WaitForSignal,
    WorkflowRuntime,
    cancel_run_cascade,
)
from mayfly.substrate import VirtualClock
from mayfly.testing._env import DEFAULT_WALL_ORIGIN_MS, SimulatedCrash

__all__ = [
    "EffectLog",
    "ExpectedRun",
    "FaultJournal",
    "FaultPlan",
    "GeneratedWorkflow",
    "Invocation",
    "SimDriver",
    "SimEvent",
    "Violation",
    "check_invariants",
    "expected_of",
    "generate_workflow",
    "sim_registry",
]

HOUR: Final = 3_600_000
DAY: Final = 24 * HOUR
SIGNAL_TIMEOUT_MS: Final = 10 * DAY
"""Every generated signal wait's deadline; signals come within hours, so clock jumps never expire them."""
SIM_HANDLER: Final = "sim.step@1"
SIM_TOKEN_PREFIX: Final = "sim-signal-token-"


# -- results ---------------------------------------------------------------------------------------


class Violation(msgspec.Struct, frozen=True):
    """One broken guarantee: ``kind`` (a short stable name), the run it was seen in, and what was wrong.

    Kinds: ``lost_ack`` (an acknowledged record is missing or changed),
    ``double_outcome`` (an attempt has two terminal outcomes),
    ``attempt_changed`` (a re-invocation under an attempt id the journal never
    started, or with another idempotency key), ``reinvoked_after_success``,
    ``result_differs`` (the terminal result is not the fault-free run's),
    ``deadline_missed`` (a signal wait expired at another time than its
    deadline, or a signal was accepted after it),
    ``not_terminal``, ``non_idempotent`` (one idempotency key, different
    outcomes), ``corruption_undetected`` / ``untyped_error`` (damage accepted
    silently, or surfaced as something other than a typed Mayfly error),
    ``unreadable`` (a typed corruption error where no damage was injected)
    and ``queue_limit``.
    """

    kind: str
    run_id: str
    message: str


class ExpectedRun(msgspec.Struct, frozen=True):
    """What a run must end as: its terminal status and its succeeded nodes' outputs (the fault-free run's)."""

    status: str
    outputs: dict[str, JsonValue] | None = None
    """The succeeded nodes' outputs; ``None``: not compared (only the status is)."""


def expected_of(result: RunResult) -> ExpectedRun:
    """The :class:`ExpectedRun` of a finished run's result."""
    return ExpectedRun(status=result.status.value, outputs=dict(result.outputs))


class Invocation(msgspec.Struct, frozen=True):
    """One handler invocation as its handler saw it; ``tick`` orders it against journal acknowledgements."""

    tick: int
    run_id: str
    node_id: str
    attempt_id: str
    idempotency_key: str
    attempt: int
    outcome: str = ""
    """The JSON of the outcome it returned (empty while it runs or if it died)."""


class EffectLog:
    """A side store that survives simulated deaths: handler invocations and journal acknowledgements.

    Handlers call :meth:`invoked` before their effect and :meth:`returned`
    after it; the :class:`FaultJournal` calls :meth:`acknowledged` when an
    append returns. One counter (``tick``) orders both, so the checker can
    tell whether an attempt ran again after its success was acknowledged.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self.invocations: list[Invocation] = []
        self.acked: dict[str, list[str]] = {}
        """Per run, the checksums of its acknowledged records in sequence order."""
        self.success_ticks: dict[str, int] = {}
        """Per attempt id, the tick at which its Succeeded outcome was acknowledged."""
        self.crash_after_effect: set[int] = set()
        """Invocation numbers (0-based, in order) after whose effect the handler dies."""

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def invoked(self, req: HandlerRequest) -> int:
        """Record an invocation about to run its effect; return its index for :meth:`returned`."""
        with self._lock:
            self.invocations.append(
                Invocation(
                    tick=self._next(),
                    run_id=req.run_id,
                    node_id=req.node_id,
                    attempt_id=req.attempt_id,
                    idempotency_key=req.idempotency_key,
                    attempt=req.attempt,
                )
            )
            return len(self.invocations) - 1

    def returned(self, index: int, outcome: object) -> None:
        """Record what invocation ``index`` returned; die here if the plan says so (after the effect)."""
        text = _outcome_text(outcome)
        with self._lock:
            self.invocations[index] = msgspec.structs.replace(self.invocations[index], outcome=text)
            die = index in self.crash_after_effect
            self.crash_after_effect.discard(index)
        if die:
            raise SimulatedCrash(f"simulated death after the effect of invocation {index}")

    def acknowledged(self, run_id: str, records: Sequence[JournalRecord]) -> None:
        """Record records a journal acknowledged (and the successes among them)."""
        with self._lock:
            tick = self._next()
            acked = self.acked.setdefault(run_id, [])
            for record in records:
                if record.sequence == len(acked) + 1:
                    acked.append(record.checksum)
                if record.event_type == "NodeOutcomeCommitted":
                    event = decode_event(record.event_type, record.schema_version, record.payload)
                    assert isinstance(event, NodeOutcomeCommitted)
                    if event.attempt_id is not None and isinstance(event.outcome, Succeeded):
                        self.success_ticks.setdefault(event.attempt_id, tick)

    def invocation_count(self) -> int:
        """How many invocations have been recorded."""
        with self._lock:
            return len(self.invocations)


def _outcome_text(outcome: object) -> str:
    if isinstance(outcome, WaitForSignal):
        return f"wait:{outcome.name}"
    try:
        return msgspec.json.encode(outcome).decode()
    except TypeError:
        return repr(outcome)


# -- the generator ---------------------------------------------------------------------------------


class SimEvent(msgspec.Struct, frozen=True):
    """Something the driver does at a virtual time: deliver a signal, cancel, or just let time pass."""

    at_ms: int
    """Run time (ms since the run's epoch); for ``advance``, time past the open waits' last deadline."""
    kind: str  # "signal" | "cancel" | "advance"
    node_id: str = ""
    decision: JsonValue = None
    token: str = ""
    """The signal's token (default: the generated workflows' token for ``node_id``)."""


class GeneratedWorkflow(msgspec.Struct, frozen=True):
    """A generated workflow: its spec, its run input, and what the driver does to it over time.

    Its handlers are :func:`sim_registry`'s, whatever process runs it. The
    expected terminal result is the fault-free run's: :meth:`SimDriver.run`
    on a fresh memory journal with no faults gives it (``mayfly_contract.sim``
    does exactly that per seed).
    """

    spec: WorkflowSpec
    input: JsonValue
    events: tuple[SimEvent, ...] = ()


def _behaviour(rng: random.Random, *, allow_signal: bool) -> dict[str, JsonValue]:
    roll = rng.random()
    value = rng.randrange(1000)
    if roll < 0.35:
        return {"b": "ok", "v": value}
    if roll < 0.6:
        return {"b": "flaky", "v": value, "fails": rng.randint(1, 2)}
    if roll < 0.72:
        return {"b": "correct", "v": value, "fixes": rng.randint(1, 2)}
    if roll < 0.82 and allow_signal:
        return {"b": "signal", "v": value}
    if roll < 0.9:
        return {"b": "fail", "v": value}
    return {"b": "ok", "v": value}


def _retry(rng: random.Random, behaviour: Mapping[str, JsonValue], max_backoff_ms: int) -> RetryPolicy:
    backoffs: list[ImmediateBackoff | FixedBackoff | ExponentialBackoff] = [
        ImmediateBackoff(),
        FixedBackoff(min(rng.choice([10, 1_000, HOUR]), max_backoff_ms)),
        ExponentialBackoff(min(100, max_backoff_ms), 2, min(60_000, max_backoff_ms)),
    ]
    backoff = rng.choice(backoffs)
    fails = behaviour.get("fails", 0)
    attempts = fails + 1 if isinstance(fails, int) and behaviour["b"] == "flaky" else 1
    if behaviour["b"] == "flaky" and rng.random() < 0.2:
        attempts = max(1, attempts - 1)  # sometimes the retries run out: the node fails
    return RetryPolicy(max_attempts=max(attempts, 1), backoff=backoff)


CHILD: Final = ChildDefinition(
    workflow_id="sim.child",
    version=1,
    nodes=(
        Node(
            "c1",
            handler=SIM_HANDLER,
            input={"b": "flaky", "v": 7, "fails": 1},
            retry=RetryPolicy(max_attempts=2),
        ),
        Node("c2", handler=SIM_HANDLER, input={"b": "ok", "v": 11}, depends_on=("c1",), outputs=("v",)),
    ),
    outputs=("v",),
)


def generate_workflow(
    rng: random.Random, *, signals: bool = True, children: bool = True, max_backoff_ms: int = HOUR
) -> GeneratedWorkflow:
    """Draw one workflow from ``rng``: a layered DAG of 2-7 nodes, each with a drawn behaviour.

    Layers fan out (every node depends on one or more nodes of the layer
    before) and fan in (a last node may depend on all). Behaviours: succeed,
    fail retryably a few times (retries with immediate, fixed or exponential
    backoff; sometimes the retries run out), ask for changes a few times (a
    self-edge correction loop), wait for a signal with a deadline (delivered
    within hours, or left to expire), fail permanently, or call a child
    workflow. A run waiting on a signal may be cancelled instead. The same
    ``rng`` state gives the same workflow. ``signals`` and ``children``
    allow signal waits and child calls; ``max_backoff_ms`` caps every retry
    delay.
    """
    nodes: list[Node] = []
    edges: list[Edge] = []
    layers: list[list[str]] = []
    waits: list[str] = []
    count = rng.randint(2, 7)
    index = 0
    while index < count:
        width = min(rng.randint(1, 3), count - index)
        layer = []
        for _ in range(width):
            node_id = f"n{index}"
            index += 1
            deps: tuple[str, ...] = ()
            if layers:
                before = layers[-1]
                deps = tuple(sorted(rng.sample(before, rng.randint(1, len(before)))))
            if children and rng.random() < 0.12:
                nodes.append(
                    Node(
                        node_id,
                        child=ChildCall("sim.child", 1, "require_success", (), ("v",)),
                        depends_on=deps,
                        retry=RetryPolicy(max_attempts=1),
                    )
                )
            else:
                behaviour = _behaviour(rng, allow_signal=signals and len(waits) < 2)
                if behaviour["b"] == "signal":
                    waits.append(node_id)
                if behaviour["b"] == "correct":
                    edges.append(Edge(node_id, node_id, OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)))
                nodes.append(
                    Node(
                        node_id,
                        handler=SIM_HANDLER,
                        input=behaviour,
                        depends_on=deps,
                        retry=_retry(rng, behaviour, max_backoff_ms),
                        outputs=("v",),
                    )
                )
            layer.append(node_id)
        layers.append(layer)
    if len(layers) > 1 and len(layers[-1]) == 1 and rng.random() < 0.5:
        pass  # the last layer already fans in
    elif len(nodes) < 8 and rng.random() < 0.4:
        everything = tuple(sorted(n.id for n in nodes if n.id in layers[-1]))
        nodes.append(
            Node(
                f"n{index}",
                handler=SIM_HANDLER,
                input={"b": "ok", "v": 1},
                depends_on=everything,
                outputs=("v",),
            )
        )
    events: list[SimEvent] = []
    at = 0
    for node_id in waits:
        at += rng.randint(1, 5) * HOUR
        fate = rng.random()
        if fate < 0.7:
            events.append(SimEvent(at, "signal", node_id, {"ok": rng.randrange(100)}))
        elif fate < 0.85:
            events.append(SimEvent(at, "cancel"))
            break
        else:
            events.append(SimEvent(rng.randint(1, 20) * DAY, "advance"))
            break
    initial = tuple(n.id for n in nodes if not n.depends_on) if edges else None
    spec = WorkflowSpec(
        f"sim.w{rng.randrange(1 << 30):08x}",
        1,
        tuple(nodes),
        edges=tuple(edges),
        initial=initial,
        catalog=(CHILD,) if any(n.child is not None for n in nodes) else (),
    )
    return GeneratedWorkflow(spec=spec, input={"seed": rng.randrange(1 << 30)}, events=tuple(events))


def _sim_step(effects: EffectLog, req: HandlerRequest) -> NodeOutcome | WaitForSignal:
    behaviour = req.input if isinstance(req.input, dict) else {}
    kind = behaviour.get("b", "ok")
    value = behaviour.get("v", 0)
    assert isinstance(value, int)
    for result in req.dependencies.values():
        output = result.output
        if isinstance(output, dict) and isinstance(output.get("v"), int):
            value = (value * 31 + output["v"]) % 1_000_003
    outcome: NodeOutcome | WaitForSignal
    fails, fixes = behaviour.get("fails", 0), behaviour.get("fixes", 0)
    if kind == "flaky" and isinstance(fails, int) and req.attempt <= fails:
        outcome = RetryableFailure(reason=f"flaky attempt {req.attempt}")
    elif kind == "correct" and isinstance(fixes, int) and req.node_attempts <= fixes:
        outcome = ChangesRequested(reason=f"fix {req.node_attempts}")
    elif kind == "fail":
        outcome = PermanentFailure(reason="generated permanent failure")
    elif kind == "signal" and req.signal is None:
        outcome = WaitForSignal(
            "go", SignalToken(SIM_TOKEN_PREFIX + req.node_id), timeout_ms=SIGNAL_TIMEOUT_MS
        )
    elif kind == "signal":
        assert req.signal is not None
        outcome = Succeeded(output={"v": value, "decision": req.signal.decision})
    else:
        outcome = Succeeded(output={"v": value})
    index = effects.invoked(req)
    effects.returned(index, outcome)
    return outcome


def sim_registry(effects: EffectLog) -> HandlerRegistry:
    """The registry every generated workflow runs on: ``sim.step@1``, recording into ``effects``.

    The handler is cooperative (it runs on the hub, so a run's schedule is
    the same every time) and deterministic in the node's input, attempt
    numbers, dependencies' outputs and signal decision, never in ids.
    """
    registry = HandlerRegistry()
    registry.register("sim.step", 1, lambda req: _sim_step(effects, req), cooperative=True)
    return registry


# -- the fault-injecting journal -------------------------------------------------------------------


class FaultPlan:
    """Which operations of a :class:`FaultJournal` die or fail, counted across every reopen.

    ``crash_before`` / ``crash_after``: operation numbers (0-based, over
    every mutating call: appends, snapshot writes, index writes) at which the
    process dies before the operation reaches the store, or right after the
    store took it but before the caller hears back. ``crash_unacknowledged``:
    operations the store took but never made durable nor acknowledged (the
    process died inside the write, so its bytes may be torn; the caller
    damages them between the death and the restart). ``io_errors``: operation
    numbers that fail with a typed :class:`~mayfly.errors.JournalUnavailable`
    (an EIO or ENOSPC at write or fsync time) without reaching the store.
    ``during``: operation number -> a callable run inside the operation,
    before it reaches the store (a lease expiring mid-commit, say).
    """

    def __init__(
        self,
        *,
        crash_before: Sequence[int] = (),
        crash_after: Sequence[int] = (),
        crash_unacknowledged: Sequence[int] = (),
        io_errors: Mapping[int, str] | None = None,
        during: Mapping[int, Callable[[], None]] | None = None,
    ) -> None:
        self.crash_before = set(crash_before)
        self.crash_after = set(crash_after)
        self.crash_unacknowledged = set(crash_unacknowledged)
        self.last: tuple[str, str] | None = None
        """The last operation tried: its name and run id (where a death left its bytes)."""
        self.io_errors = dict(io_errors or {})
        self.during = dict(during or {})
        self._description = self._describe()
        self.operations = 0
        self.deaths = 0
        self.io_failures = 0

    def describe(self) -> str:
        """A short description of the plan as it was made (for reports)."""
        return self._description

    def _describe(self) -> str:
        parts = []
        if self.crash_before:
            parts.append(f"die before ops {sorted(self.crash_before)}")
        if self.crash_after:
            parts.append(f"die after ops {sorted(self.crash_after)}")
        if self.crash_unacknowledged:
            parts.append(f"die inside ops {sorted(self.crash_unacknowledged)}")
        if self.io_errors:
            parts.append(f"io errors at {sorted(self.io_errors.items())}")
        return ", ".join(parts) or "no journal faults"


_MUTATING: Final = frozenset({"append", "append_indexed", "write_snapshot", "index_put"})


class FaultJournal:
    """A journal that forwards everything to ``inner`` and injects its :class:`FaultPlan` into mutations.

    Every other attribute (reads, the run index, queues, capabilities) is the
    inner journal's, so the runtime sees the backend's own features. After a
    death every call raises :class:`SimulatedCrash`: a dead process writes
    nothing more. Acknowledged appends are recorded in ``effects``.
    """

    def __init__(self, inner: WorkflowJournal, plan: FaultPlan, effects: EffectLog) -> None:
        self.inner = inner
        self.plan = plan
        self.effects = effects
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in _MUTATING:
            return self._wrap(name, value)
        if callable(value) and name not in ("close",):
            return self._alive(value)
        return value

    def _alive(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise SimulatedCrash("the process is dead")
            return fn(*args, **kwargs)

        return call

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            plan = self.plan
            if self.dead:
                raise SimulatedCrash("the process is dead")
            op = plan.operations
            plan.operations += 1
            plan.last = (name, str(args[0]) if args and isinstance(args[0], str) else "")
            if op in plan.during:
                plan.during.pop(op)()
            if op in plan.crash_before:
                plan.crash_before.discard(op)
                self._die(f"before {name} (operation {op})")
            if op in plan.io_errors:
                plan.io_failures += 1
                raise JournalUnavailable(
                    f"simulated {plan.io_errors.pop(op)} during {name} (operation {op}): "
                    "nothing was written; retry once the storage is healthy"
                )
            result = fn(*args, **kwargs)
            if op in plan.crash_unacknowledged:
                plan.crash_unacknowledged.discard(op)
                self._die(f"inside {name} (operation {op}), before it was durable")
            if name in ("append", "append_indexed") and isinstance(result, AppendResult):
                self.effects.acknowledged(args[0], args[2])
            if op in plan.crash_after:
                plan.crash_after.discard(op)
                self._die(f"after {name} (operation {op}), before its caller heard back")
            return result

        return call

    def _die(self, where: str) -> None:
        self.dead = True
        self.plan.deaths += 1
        raise SimulatedCrash(f"simulated death {where}")

    # The protocol's own members, so isinstance checks and type checkers see a journal.
    @property
    def url(self) -> str:
        """The inner journal's URL."""
        return self.inner.url

    @property
    def durability(self) -> Any:
        """The inner journal's durability."""
        return self.inner.durability

    @property
    def capabilities(self) -> Any:
        """The inner journal's capabilities."""
        return self.inner.capabilities

    def append(
        self, run_id: str, expected_next: int, records: Sequence[JournalRecord], fence: int | None = None
    ) -> AppendResult:
        """Append through the fault plan."""
        result: AppendResult = self._wrap("append", self.inner.append)(run_id, expected_next, records, fence)
        return result

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Read from the inner journal (refused once dead)."""
        result: list[JournalRecord] = self._alive(self.inner.read)(run_id, after, limit)
        return result

    def next_sequence(self, run_id: str) -> int:
        """The inner journal's next sequence (refused once dead)."""
        result: int = self._alive(self.inner.next_sequence)(run_id)
        return result

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """The inner journal's runs (refused once dead)."""
        result: list[str] = self._alive(self.inner.list_runs)(after, limit)
        return result

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Write a snapshot through the fault plan."""
        self._wrap("write_snapshot", self.inner.write_snapshot)(run_id, snapshot)

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """The inner journal's snapshot (refused once dead)."""
        result: SnapshotRecord | None = self._alive(self.inner.read_snapshot)(run_id)
        return result

    def close(self) -> None:
        """Close the inner journal."""
        self.inner.close()

    def __enter__(self) -> FaultJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TrackedLeases:
    """A lease store that remembers the guards it handed out, so a simulated death can drop them.

    A killed process loses its leases with its file descriptors and
    connections (an flock is released, a TTL lease expires during the
    downtime); an abandoned runtime in this process would hold them forever,
    so the driver releases them when it restarts.
    """

    def __init__(self, inner: RecoveryLeaseStore) -> None:
        self.inner = inner
        self.guards: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def url(self) -> str:
        """The inner store's URL."""
        return self.inner.url

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> Any:
        """Acquire through the inner store, remembering the guard."""
        guard = self.inner.acquire(run_id, owner, ttl_ms)
        self.guards.append(guard)
        return guard

    def current_fence(self, run_id: str) -> int:
        """The inner store's current fence."""
        return self.inner.current_fence(run_id)

    def drop_all(self, survivor: RecoveryLeaseStore) -> None:
        """Release every lease the dead process took, through ``survivor`` (the restarted process's store).

        The dead store's own connections may be stuck in the middle of an
        abandoned call, so each grant is released on the new store's
        connection (what its TTL expiring during the downtime would do; a
        grant taken over since is left alone, as ``release`` always does).
        """
        for guard in self.guards:
            with contextlib.suppress(Exception):  # a guard of another kind, or its grant is gone
                guard._store = survivor  # re-homed onto the live store
                guard._released = False
                guard.release()
        self.guards.clear()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()

    def __enter__(self) -> _TrackedLeases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the driver ------------------------------------------------------------------------------------

Opener = Callable[[], tuple[WorkflowJournal, RecoveryLeaseStore]]
"""Opens the backend afresh (a restarted process): its journal and its lease store."""


class SimDriver:
    """Drive one run of a :class:`GeneratedWorkflow` (or any spec) to its end through simulated deaths.

    ``open`` opens the backend; ``plan`` says where the journal dies; ``ids``
    must be unique per run on a shared store. ``wall_jumps`` maps a restart
    number to a wall-clock jump in ms (positive: forward, negative: backward)
    applied to the restarted process's clock; ``downtime_ms`` is virtual time
    that passes at every death before the restart (a long outage).
    ``on_death`` is called once a dead process's backend is closed and
    before the restart opens it again (to damage storage as a crash or a disk
    would); ``on_restart`` after every restart (to check invariants between
    steps).
    """

    def __init__(
        self,
        open: Opener,
        registry: HandlerRegistry,
        *,
        plan: FaultPlan | None = None,
        effects: EffectLog | None = None,
        ids: IdSource | None = None,
        wall_jumps: Mapping[int, int] | None = None,
        downtime_ms: int = 0,
        max_restarts: int = 64,
        snapshot_every: int = 1_000,
        lease_ttl_ms: int = 86_400_000,
        on_restart: Callable[[SimDriver], None] | None = None,
        on_death: Callable[[SimDriver], None] | None = None,
    ) -> None:
        self._open = open
        self.registry = registry
        self.plan = plan if plan is not None else FaultPlan()
        self.effects = effects if effects is not None else EffectLog()
        self.ids = ids if ids is not None else DeterministicIdSource()
        self.clock = VirtualClock(wall_origin_ms=DEFAULT_WALL_ORIGIN_MS)
        self.wall_jumps = dict(wall_jumps or {})
        self.downtime_ms = downtime_ms
        self.max_restarts = max_restarts
        self.snapshot_every = snapshot_every
        self.lease_ttl_ms = lease_ttl_ms
        self.on_restart = on_restart
        self.on_death = on_death
        self.restarts = 0
        self.errors: list[MayflyError] = []
        """Typed errors the runtime surfaced (and the driver retried past), in order."""
        self.journal: FaultJournal | None = None
        self.leases: RecoveryLeaseStore | None = None
        self.runtime: WorkflowRuntime | None = None
        self._generation = 0
        self._boot()

    def _boot(self) -> None:
        self._generation += 1
        inner, leases = self._open()
        self.journal = FaultJournal(inner, self.plan, self.effects)
        self.leases = _TrackedLeases(leases)
        self.runtime = WorkflowRuntime(
            self.journal,
            self.registry,
            leases=self.leases,
            ids=self.ids,
            clock=lambda: self.clock,
            owner=f"sim-owner-{self._generation}",
            lease_ttl_ms=self.lease_ttl_ms,
            snapshot_every=self.snapshot_every,
        )

    def _restart(self) -> None:
        """The process died: drop everything it held, let the downtime pass, and boot a new one."""
        self.restarts += 1
        dead = self.leases
        if self.restarts > self.max_restarts:
            raise MayflyError(f"the run needed more than {self.max_restarts} restarts: it makes no progress")
        for closing in (self.journal, self.leases):
            try:
                if closing is not None:
                    closing.close()
            except Exception:
                pass
        if self.on_death is not None:
            self.on_death(self)  # the process is gone and the backend closed: damage storage here
        now = self.clock.now_ms() + self.downtime_ms
        wall = self.clock.wall_ms() + self.downtime_ms + self.wall_jumps.get(self.restarts, 0)
        self.clock = VirtualClock(now, wall_origin_ms=max(0, wall - now))
        self._boot()
        if isinstance(dead, _TrackedLeases) and isinstance(self.leases, _TrackedLeases):
            dead.drop_all(self.leases.inner)
        if self.on_restart is not None:
            self.on_restart(self)

    def close(self) -> None:
        """Close the current journal and lease store."""
        for closing in (self.journal, self.leases):
            if closing is not None:
                closing.close()

    def _attempt(self, action: Callable[[WorkflowRuntime], object]) -> bool:
        """Run ``action`` on the current runtime; on a death restart and return False."""
        assert self.runtime is not None
        try:
            action(self.runtime)
        except SimulatedCrash:
            self._restart()
            return False
        except MayflyError as exc:
            if not isinstance(exc, JournalUnavailable):
                raise
            self.errors.append(exc)  # surfaced, nothing acknowledged: a restarted process retries
            self._restart()
            return False
        return True

    def _drive(self, spec: WorkflowSpec, input: JsonValue, run_id: str) -> RunResult | None:
        """Create or resume the run and drive it until it parks; ``None`` if the process died on the way."""
        drives: list[RunResult] = []

        def drive(rt: WorkflowRuntime) -> None:
            if self._exists(run_id):
                drives.append(rt.resume(run_id))
            else:
                drives.append(rt.execute(spec, input, run_id=run_id))

        self._attempt(drive)
        return drives[0] if drives else None

    def _exists(self, run_id: str) -> bool:
        assert self.journal is not None
        return self.journal.inner.next_sequence(run_id) > 1

    def run(
        self, spec: WorkflowSpec, input: JsonValue, run_id: str, events: Sequence[SimEvent] = ()
    ) -> RunResult:
        """Create (or recover) the run and drive it, with ``events`` at their times, until it is terminal."""
        pending = sorted(events, key=lambda e: e.at_ms)
        signal_ids: dict[int, str] = {}
        parked: RunResult | None = None  # what the last drive that ran to its end returned
        for _ in range(10_000):
            if parked is None:
                parked = self._drive(spec, input, run_id)
                continue
            result, parked = parked, None
            if result.status.is_terminal:
                return result
            if not pending:
                raise MayflyError(
                    f"run {run_id} waits for {result.waiting} and the plan has nothing left to send"
                )
            event = pending[0]
            epoch, deadline = self._epoch(run_id)
            # An "advance" goes past the last open wait's deadline (however late the wait opened).
            target = epoch + event.at_ms + (deadline if event.kind == "advance" else 0)
            if target > self.clock.wall_ms():
                self.clock.advance_to(self.clock.now_ms() + target - self.clock.wall_ms())
            if event.kind == "signal" and event.node_id not in result.waiting:
                pending.pop(0)  # its wait is not open (the node failed or was never reached)
                continue
            if event.kind == "signal":
                # One signal id per planned signal: a resend after a death is the same delivery.
                signal_id = signal_ids.setdefault(id(event), self.ids.new_id())

                def send(rt: WorkflowRuntime, event: SimEvent = event, signal_id: str = signal_id) -> None:
                    token = SignalToken(event.token or SIM_TOKEN_PREFIX + event.node_id)
                    rt.signal(run_id, event.node_id, token, event.decision, signal_id=signal_id)

                if self._attempt(send):
                    pending.pop(0)
            elif event.kind == "cancel":

                def cancel(rt: WorkflowRuntime) -> None:
                    cancel_run_cascade(
                        rt.journal,
                        rt.leases,
                        run_id,
                        requester="sim",
                        reason="simulated cancellation",
                        owner=rt.owner,
                        ids=self.ids,
                        ttl_ms=rt.lease_ttl_ms,
                    )

                if self._attempt(cancel):
                    pending.pop(0)
            else:
                pending.pop(0)
        raise MayflyError(f"run {run_id} did not finish in 10000 drives")

    def _epoch(self, run_id: str) -> tuple[int, int]:
        """The run's epoch (wall ms) and the latest deadline of its open signal waits (run time)."""
        assert self.runtime is not None
        state = self.runtime.inspect(run_id).state
        deadlines = [
            n.wait.deadline for n in state.nodes if n.wait is not None and n.wait.deadline is not None
        ]
        epoch = state.epoch_ms if state.epoch_ms is not None else self.clock.wall_ms()
        return epoch, max(deadlines, default=0)


# -- invariants ------------------------------------------------------------------------------------


def _events(journal: WorkflowJournal, run_id: str) -> list[Event]:
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def _run_tree(journal: WorkflowJournal, run_id: str) -> Iterator[tuple[str, list[Event]]]:
    stack = [run_id]
    while stack:
        current = stack.pop()
        events = _events(journal, current)
        yield current, events
        stack.extend(e.child_run_id for e in events if isinstance(e, ChildStarted))


def check_invariants(
    journal: WorkflowJournal,
    runs: Mapping[str, ExpectedRun | None],
    *,
    acknowledged: Mapping[str, int | Sequence[str]],
    effects: EffectLog | None = None,
    require_terminal: bool = True,
) -> list[Violation]:
    """Check the simulator's invariants on ``journal``; return every violation (empty when all hold).

    ``runs`` maps each root run id to its expected terminal result (the
    fault-free run's) or ``None`` to skip that comparison. ``acknowledged``
    maps a run id to the number of records acknowledged to a caller, or to
    their checksums in sequence order (then each must be stored unchanged).
    With ``effects`` (the handlers' side store) re-invocations are checked
    too: every invocation ran under an attempt id the journal started, with
    that attempt's idempotency key; no attempt ran again after its success
    was acknowledged; one idempotency key never produced two different
    outcomes. Child runs are checked with their roots. A typed
    :class:`~mayfly.errors.CorruptionError` while reading is reported as an
    ``unreadable`` violation (the caller decides whether damage was injected).
    """
    violations: list[Violation] = []
    started: dict[str, tuple[str, str]] = {}  # attempt id -> (run id, node id)
    for run_id, want in acknowledged.items():
        try:
            records = journal.read(run_id)
        except CorruptionError as exc:
            violations.append(Violation("unreadable", run_id, f"{type(exc).__name__}: {exc}"))
            continue
        if isinstance(want, int):
            if len(records) < want:
                violations.append(
                    Violation(
                        "lost_ack", run_id, f"{want} records were acknowledged, {len(records)} are stored"
                    )
                )
            continue
        stored = [r.checksum for r in records]
        for sequence, checksum in enumerate(want, start=1):
            if sequence > len(stored) or stored[sequence - 1] != checksum:
                violations.append(
                    Violation("lost_ack", run_id, f"acknowledged record {sequence} is missing or changed")
                )
                break
    for root, expected in runs.items():
        try:
            tree = list(_run_tree(journal, root))
        except CorruptionError as exc:
            violations.append(Violation("unreadable", root, f"{type(exc).__name__}: {exc}"))
            continue
        for run_id, events in tree:
            violations.extend(_check_deadlines(run_id, events))
            outcomes: dict[str, int] = {}
            for event in events:
                if isinstance(event, NodeStarted | ChildStarted):
                    started[event.attempt_id] = (run_id, event.node_id)
                if isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                    outcomes[event.attempt_id] = outcomes.get(event.attempt_id, 0) + 1
            for attempt_id, count in outcomes.items():
                if count > 1:
                    violations.append(
                        Violation(
                            "double_outcome", run_id, f"attempt {attempt_id} has {count} terminal outcomes"
                        )
                    )
        events = tree[0][1]
        if not events:
            violations.append(Violation("not_terminal", root, "the run has no records"))
            continue
        state = replay(events)
        if not state.status.is_terminal:
            if require_terminal:
                violations.append(Violation("not_terminal", root, f"the run ended {state.status.value}"))
            continue
        if expected is not None:
            got = expected_of(RunResult.of(state))
            if expected.outputs is None:
                got = ExpectedRun(status=got.status)
            if got != expected:
                violations.append(
                    Violation(
                        "result_differs",
                        root,
                        f"ended {got.status} with outputs {got.outputs}; the fault-free run ended "
                        f"{expected.status} with outputs {expected.outputs}",
                    )
                )
    if effects is not None:
        violations.extend(_check_effects(effects, started, runs))
    return violations


def _check_deadlines(run_id: str, events: Sequence[Event]) -> list[Violation]:
    """Signal waits end on time: expired at their own deadline, never answered after it."""
    violations: list[Violation] = []
    now = 0
    deadlines: dict[str, int | None] = {}
    for event in events:
        if isinstance(event, VirtualTimeAdvanced):
            now = event.to
        elif isinstance(event, SignalWaitOpened):
            deadlines[event.attempt_id] = event.deadline
        elif isinstance(event, SignalExpired):
            opened = deadlines.get(event.attempt_id)
            if opened != event.deadline or now != event.deadline:
                violations.append(
                    Violation(
                        "deadline_missed",
                        run_id,
                        f"the wait of {event.node_id} (deadline {opened}) expired at run time {now} "
                        f"recording deadline {event.deadline}",
                    )
                )
        elif isinstance(event, SignalAccepted):
            opened = deadlines.get(event.attempt_id)
            if opened is not None and event.at >= opened:
                violations.append(
                    Violation(
                        "deadline_missed",
                        run_id,
                        f"a signal to {event.node_id} was accepted at {event.at}, past its deadline {opened}",
                    )
                )
    return violations


def _check_effects(
    effects: EffectLog, started: Mapping[str, tuple[str, str]], runs: Mapping[str, object]
) -> list[Violation]:
    violations: list[Violation] = []
    by_key: dict[str, set[str]] = {}
    for inv in effects.invocations:
        where = started.get(inv.attempt_id)
        if where is None:
            if inv.run_id in runs:
                violations.append(
                    Violation(
                        "attempt_changed",
                        inv.run_id,
                        f"{inv.node_id} ran under unknown attempt {inv.attempt_id}",
                    )
                )
            continue
        if where != (inv.run_id, inv.node_id):
            violations.append(
                Violation("attempt_changed", inv.run_id, f"attempt {inv.attempt_id} belongs to {where}")
            )
        if inv.idempotency_key != idempotency_key(inv.run_id, inv.node_id, inv.attempt_id):
            violations.append(
                Violation(
                    "attempt_changed",
                    inv.run_id,
                    f"attempt {inv.attempt_id} ran with another idempotency key",
                )
            )
        success = effects.success_ticks.get(inv.attempt_id)
        if success is not None and inv.tick > success:
            violations.append(
                Violation(
                    "reinvoked_after_success",
                    inv.run_id,
                    f"{inv.node_id} attempt {inv.attempt_id} ran again after its success was acknowledged",
                )
            )
        if inv.outcome and not inv.outcome.startswith("wait:"):
            by_key.setdefault(f"{inv.run_id}\x1f{inv.node_id}\x1f{inv.idempotency_key}", set()).add(
                inv.outcome
            )
    for key, outcomes in sorted(by_key.items()):
        if len(outcomes) > 1:
            run_id, node_id, ikey = key.split("\x1f")
            shown = " vs ".join(sorted(outcomes))
            violations.append(
                Violation(
                    "non_idempotent",
                    run_id,
                    f"{node_id} returned different outcomes for one idempotency key {ikey}: {shown}",
                )
            )
    return violations


# RunStatus is re-exported for callers comparing ExpectedRun.status.
_ = RunStatus
