"""The ``queue`` family: several runs on a queue with a concurrency limit, drained by a worker that dies.

Per seed: two to five generated workflows are submitted to a queue of the
seed's own whose ``concurrency`` is 1 or 2, and a :class:`~mayfly.Worker`
(on the fault-injecting journal, in real time) drains it. The worker
dies before or after seeded journal operations and is restarted (a new
process) until every run has ended. At every journal operation the queue's
runs in progress (``queue_usage``) are sampled: more than the limit is a
``queue_limit`` violation. At the end every run is checked against its own
fault-free result, with the other invariants.
"""

from __future__ import annotations

import contextlib
import functools

from mayfly.queues import QUEUE_CONTROL, QueueSettings
from mayfly.runindex import RUN_INDEX
from mayfly.runtime import WorkflowRuntime
from mayfly.substrate import RealClock
from mayfly.testing import (
    EffectLog,
    FaultJournal,
    FaultPlan,
    SimulatedCrash,
    TrackedLeases,
    Violation,
    check_invariants,
    generate_workflow,
    sim_registry,
)
from mayfly.worker import Worker
from mayfly_contract.sim._context import SeedContext, SeedResult

__all__ = ["queue_family"]


def queue_family(ctx: SeedContext) -> SeedResult:
    """Drain a limited queue with a worker that keeps dying; the limit must hold at every operation."""
    rng = ctx.rng
    backend = ctx.backend
    result = SeedResult("queue")
    workflows = [
        # Retries wait 10 ms at most: the worker runs in real time (a worker parked on its wake-up
        # channel keeps a virtual clock from jumping to the next backoff).
        generate_workflow(rng, signals=False, max_backoff_ms=10)
        for _ in range(rng.randint(2, 5))
    ]
    references = [ctx.reference(workflow) for workflow in workflows]
    limit = rng.randint(1, 2)
    queue = f"sim-q-{ctx.seed}"
    url = backend.url(ctx.seed)
    operations = sum(reference.operations for reference in references)
    picks = sorted(rng.sample(range(operations), min(operations, rng.randint(1, 3))))
    before = [op for op in picks if rng.random() < 0.5]
    plan = FaultPlan(crash_before=before, crash_after=[op for op in picks if op not in before])
    effects = EffectLog()
    registry = sim_registry(effects)
    ids = ctx.ids()
    run_ids = [ids.new_id() for _ in workflows]
    clock = RealClock()
    seen = {"max": 0, "samples": 0}
    found: list[Violation] = []

    journal, leases = backend.open(url)
    try:
        control = QUEUE_CONTROL.of(journal)
        if control is None:
            result.notes.append(f"{backend.name} offers no queue control")
            return result
        control.queue_set(QueueSettings(name=queue, concurrency=limit))
        submitter = WorkflowRuntime(journal, registry, leases=leases, ids=ids)
        for workflow, run_id in zip(workflows, run_ids, strict=True):
            submitter.start(workflow.spec, workflow.input, run_id=run_id, queue=queue)
    finally:
        journal.close()
        leases.close()

    def done(journal: FaultJournal) -> bool:
        index = RUN_INDEX.of(journal.inner)
        assert index is not None
        for run_id in run_ids:
            entry = index.index_get(run_id)
            if entry is None or entry.status.value != "terminal":
                return False
        return True

    restarts = 0
    for generation in range(1, 40):
        inner, raw_leases = backend.open(url)
        tracked = TrackedLeases(raw_leases)
        leases = tracked
        journal = FaultJournal(inner, plan, effects)
        sampler = QUEUE_CONTROL.of(inner)
        assert sampler is not None

        def sample(sampler: object = sampler) -> None:
            usage = sampler.queue_usage(queue, now_ms=clock.wall_ms())  # type: ignore[attr-defined]
            seen["samples"] += 1
            seen["max"] = max(seen["max"], usage.in_progress)
            if usage.in_progress > limit:
                found.append(
                    Violation(
                        "queue_limit",
                        "",
                        f"{usage.in_progress} runs in progress on a queue limited to {limit}",
                    )
                )

        journal.on_operation = sample
        worker = Worker(
            journal,
            registry,
            leases=leases,
            ids=ids,
            owner=f"sim-worker-{ctx.seed}-{generation}",
            concurrency=4,
            queues=[queue],
            poll_interval_ms=50,
            # Short enough that a slot the simulated death could not hand back (a lease granted in the
            # claim that died) frees at its TTL, as after a real death; Redis counts a queue's runs in
            # progress until their leases' expiry.
            lease_ttl_ms=5_000,
            log=lambda record: None,
        )
        try:
            worker.run(until=functools.partial(done, journal))
            finished = True
        except SimulatedCrash:
            finished = False
        except Exception as exc:
            result.violations.append(Violation("driver_error", "", f"{type(exc).__name__}: {exc}"))
            finished = True
        finally:
            with contextlib.suppress(Exception):
                journal.close()
            with contextlib.suppress(Exception):
                leases.close()
        if finished:
            break
        restarts += 1
        # The dead worker's leases end with it (its flocks close, its TTLs run out during the downtime).
        backend.bury(f"sim-worker-{ctx.seed}-{generation}")
        survivor = backend.open(url)
        try:
            tracked.drop_all(survivor[1])
        finally:
            survivor[0].close()
            survivor[1].close()
    inner, leases = backend.open(url)
    try:
        result.violations.extend(found[:1])
        result.violations.extend(
            check_invariants(
                inner,
                {run_id: reference.expected for run_id, reference in zip(run_ids, references, strict=True)},
                acknowledged=effects.acked,
                effects=effects,
            )
        )
    finally:
        inner.close()
        leases.close()
    result.notes.append(
        f"{len(run_ids)} runs, concurrency {limit}; {plan.describe()}; {restarts} worker deaths; "
        f"at most {seen['max']} in progress over {seen['samples']} samples"
    )
    return result
