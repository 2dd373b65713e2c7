"""``simulate``: a user's own workflow under seeded crashes and clock faults, and the guarantees it broke.

For each seed the workflow runs once with no faults (the reference), then
again under the seed's faults: the process dies before or after chosen
journal operations and right after a chosen handler's effect, and each
restarted process's wall clock may have jumped. Every handler invocation is
recorded with its attempt id and idempotency key. A seed fails when a
guarantee breaks (see :class:`~mayfly.testing.Violation`), including the one
only the user's code can break: a handler re-invoked under the same
idempotency key that returns a different outcome is not idempotent (it
charged twice, say).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.json import JsonValue
from mayfly.model.spec import WorkflowSpec
from mayfly.plugins import open_journal, open_leases
from mayfly.runtime import HandlerRegistry, HandlerRequest
from mayfly.substrate import offload
from mayfly.testing._memory import MemoryJournal, MemoryLeaseStore, MemoryStore, drop_store
from mayfly.testing._sim import (
    DAY,
    HOUR,
    EffectLog,
    ExpectedRun,
    FaultPlan,
    SimDriver,
    SimEvent,
    Violation,
    check_invariants,
    expected_of,
)

__all__ = ["SeedFailure", "SimulationReport", "simulate"]

_REFERENCE_NAMESPACE: Final = 0xFFFF0000
"""Id namespace of the fault-free reference runs (apart from every seed's)."""


class SeedFailure(msgspec.Struct, frozen=True):
    """One failing seed: its violations, what its faults were, and the call that replays it."""

    seed: int
    violations: tuple[Violation, ...]
    faults: str
    reproduce: str


class SimulationReport(msgspec.Struct, frozen=True):
    """What :func:`simulate` found: how many seeds ran, and each failing seed."""

    seeds: int
    failures: tuple[SeedFailure, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every seed kept every guarantee."""
        return not self.failures

    def __str__(self) -> str:
        lines = []
        for failure in self.failures:
            lines.append(f"seed {failure.seed} ({failure.faults}):")
            lines.extend(f"  {v.kind} in run {v.run_id}: {v.message}" for v in failure.violations)
            lines.append(f"  reproduce: {failure.reproduce}")
        lines.append(f"{self.seeds} seeds, {sum(len(f.violations) for f in self.failures)} violations")
        return "\n".join(lines)


def _handler_refs(spec: WorkflowSpec) -> set[str]:
    refs = {node.handler for node in spec.nodes if node.handler is not None}
    for child in spec.catalog:
        refs.update(node.handler for node in child.nodes if node.handler is not None)
    return refs


def _recording(registry: HandlerRegistry, spec: WorkflowSpec, effects: EffectLog) -> HandlerRegistry:
    """A registry serving the spec's handlers through ``registry``'s, recording invocations in ``effects``."""
    recorded = HandlerRegistry()
    seen: set[tuple[str, int]] = set()
    for ref in sorted(_handler_refs(spec)):
        entry = registry.resolve(ref)
        if entry is None or (entry.name, entry.version) in seen:
            continue  # a missing handler is the runtime's to report (the node is Blocked)
        seen.add((entry.name, entry.version))

        def call(
            req: HandlerRequest,
            fn: Callable[[HandlerRequest], Any] = entry.fn,
            inline: bool = entry.cooperative,
        ) -> Any:
            index = effects.invoked(req)
            # Offloaded as the runtime would, but from this wrapper on the hub, so that a death
            # after the effect (raised by ``returned``) stops the hub, not an offload thread.
            outcome = fn(req) if inline else offload(fn, req)
            effects.returned(index, outcome)
            return outcome

        recorded.register(
            entry.name,
            entry.version,
            call,
            compatible_with=sorted(entry.compatible - {entry.version}),
            cooperative=True,
            non_retryable=entry.non_retryable,
        )
    return recorded


def _opener(
    backend: str, seed: int, slot: str
) -> tuple[Callable[[], tuple[WorkflowJournal, RecoveryLeaseStore]], str]:
    if backend == "memory":
        store = MemoryStore()
        return (lambda: (MemoryJournal(store.url), MemoryLeaseStore(store.url))), store.name
    url = backend.replace("{seed}", str(seed)).replace("{slot}", slot)
    return (lambda: (open_journal(url), open_leases(url))), ""


def simulate(
    spec: WorkflowSpec,
    registry: HandlerRegistry,
    *,
    seeds: int | Iterable[int] = 100,
    input: JsonValue = None,
    events: Sequence[SimEvent] = (),
    backend: str = "memory",
    compare_outputs: bool = False,
    crashes: int = 2,
) -> SimulationReport:
    """Run ``spec`` on ``registry``'s handlers under each seed's crash and time faults; report what broke.

    ``seeds`` is a count (seeds ``0 .. n-1``) or the seeds themselves. Each
    seed first runs the workflow with no faults, then with up to ``crashes``
    simulated process deaths (before or after a journal operation, or right
    after one handler's effect, before its outcome is recorded) and wall-clock
    jumps at restarts. ``events`` are signals (``SimEvent(at_ms, "signal",
    node_id, decision, token=...)``), cancellations or waits past a deadline,
    each at its run time. ``backend`` is ``"memory"`` or a journal URL, where
    ``{seed}`` and ``{slot}`` are replaced to give each run a fresh store
    (``"file:///tmp/sim/{seed}-{slot}"``).

    A seed fails on any :class:`~mayfly.testing.Violation`: a handler
    returning different outcomes for one idempotency key (``non_idempotent``,
    a handler that is not safe to re-invoke), a re-invocation under another
    attempt id or key, a re-invocation after the attempt's success was
    recorded, an attempt with two outcomes, an acknowledged record lost, or
    a terminal status (with ``compare_outputs``, also outputs) other than the
    fault-free run's. Outputs are not compared by default, since a handler's
    output may honestly depend on state outside the run.
    """
    chosen = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    failures = []
    for seed in chosen:
        violations, faults = _one_seed(spec, registry, seed, input, events, backend, compare_outputs, crashes)
        if violations:
            failures.append(
                SeedFailure(
                    seed=seed,
                    violations=tuple(violations),
                    faults=faults,
                    reproduce=f"simulate(spec, registry, seeds=[{seed}])",
                )
            )
    return SimulationReport(seeds=len(chosen), failures=tuple(failures))


def _one_seed(  # noqa: PLR0917 - one seed's whole setup
    spec: WorkflowSpec,
    registry: HandlerRegistry,
    seed: int,
    input: JsonValue,
    events: Sequence[SimEvent],
    backend: str,
    compare_outputs: bool,
    crashes: int,
) -> tuple[list[Violation], str]:
    rng = random.Random(seed)
    stores: list[str] = []
    # The reference: no faults, ids of their own (so its idempotency keys are not the faulty run's).
    effects = EffectLog()
    open_ref, name = _opener(backend, seed, "reference")
    stores.append(name)
    reference = SimDriver(
        open_ref,
        _recording(registry, spec, effects),
        effects=effects,
        ids=DeterministicIdSource(_REFERENCE_NAMESPACE),
    )
    try:
        try:
            result = reference.run(spec, input, reference.ids.new_id(), events)
        finally:
            reference.close()
        expected = expected_of(result)
        if not compare_outputs:
            expected = ExpectedRun(status=expected.status, outputs=None)
        operations = max(reference.plan.operations, 1)
        invocations = effects.invocation_count()
        picks = sorted(rng.sample(range(operations), min(operations, rng.randint(1, max(crashes, 1)))))
        before = [op for op in picks if rng.random() < 0.5]
        plan = FaultPlan(crash_before=before, crash_after=[op for op in picks if op not in before])
        effects = EffectLog()
        if invocations:
            effects.crash_after_effect = {rng.randrange(invocations)}
        jumps = {n: rng.choice([0, 0, -HOUR, -DAY, 1_000]) for n in range(1, 8)}
        open_run, name = _opener(backend, seed, "faulty")
        stores.append(name)
        driver = SimDriver(
            open_run,
            _recording(registry, spec, effects),
            plan=plan,
            effects=effects,
            ids=DeterministicIdSource(seed % (1 << 31)),
            wall_jumps=jumps,
        )
        faults = f"{plan.describe()}; handler death after invocation {sorted(effects.crash_after_effect)}"
        run_id = driver.ids.new_id()
        try:
            driver.run(spec, input, run_id, events)
            assert driver.journal is not None
            violations = check_invariants(
                driver.journal.inner, {run_id: expected}, acknowledged=effects.acked, effects=effects
            )
        finally:
            driver.close()
        return violations, faults
    finally:
        for store in stores:
            if store:
                drop_store(store)
