"""The ``crash`` family: a generated workflow through seeded deaths, I/O errors and clock faults.

Per seed: the workflow's fault-free run on a private memory store gives the
expected result and how many journal operations and handler invocations the
run takes. The faulty run then dies before or after one to three of those
operations and right after one handler's effect, sees typed EIO/ENOSPC
failures at write time, and restarts each time with a clock that jumped
forward or backward, after a downtime. Invariants are checked after every
restart (nothing acknowledged lost) and at the end (all of them).
"""

from __future__ import annotations

from mayfly.testing import (
    EffectLog,
    FaultPlan,
    SimDriver,
    Violation,
    check_invariants,
    generate_workflow,
    sim_registry,
)
from mayfly_contract.sim._context import SeedContext, SeedResult

__all__ = ["crash_family"]

HOUR = 3_600_000
DAY = 24 * HOUR


def crash_family(ctx: SeedContext) -> SeedResult:
    """Run one generated workflow under a seeded schedule of deaths, I/O errors and time faults."""
    rng = ctx.rng
    workflow = generate_workflow(rng)
    reference = ctx.reference(workflow)
    operations = max(reference.operations, 1)
    picks = sorted(rng.sample(range(operations), min(operations, rng.randint(1, 3))))
    before = [op for op in picks if rng.random() < 0.5]
    after = [op for op in picks if op not in before]
    io_errors = {}
    if rng.random() < 0.3:
        io_errors[rng.randrange(operations)] = rng.choice(["EIO at write", "EIO at fsync", "ENOSPC at write"])
    plan = FaultPlan(crash_before=before, crash_after=after, io_errors=io_errors)
    effects = EffectLog()
    if reference.invocations and rng.random() < 0.6:
        effects.crash_after_effect = {rng.randrange(reference.invocations)}
    # Time faults: each restart's clock may jump back (up to a day) or forward (up to an hour: signals
    # arrive hours before their 10-day deadlines, so no jump may expire one), after a downtime that is
    # long (a day; a month when nothing waits for a signal) or none.
    jumps = {n: rng.choice([0, 0, -HOUR, -DAY, HOUR // 2, HOUR]) for n in range(1, 8)}
    signals = any(event.kind == "signal" for event in workflow.events)
    downtime = rng.choice([0, 0, HOUR, DAY] + ([] if signals else [30 * DAY]))
    url = ctx.backend.url(ctx.seed)
    result = SeedResult("crash")
    lost: list[Violation] = []

    def between(driver: SimDriver) -> None:
        assert driver.journal is not None
        lost.extend(check_invariants(driver.journal.inner, {}, acknowledged=effects.acked))

    driver = SimDriver(
        ctx.backend.opener(url),
        sim_registry(effects),
        plan=plan,
        effects=effects,
        ids=ctx.ids(),
        wall_jumps=jumps,
        downtime_ms=downtime,
        on_restart=between,
        on_death=lambda dead: ctx.backend.bury(dead.runtime.owner if dead.runtime else ""),
    )
    try:
        run_id = driver.ids.new_id()
        driver.run(workflow.spec, workflow.input, run_id, workflow.events)
        assert driver.journal is not None
        result.violations.extend(lost)
        result.violations.extend(
            check_invariants(
                driver.journal.inner,
                {run_id: reference.expected},
                acknowledged=effects.acked,
                effects=effects,
            )
        )
    except Exception as exc:
        result.violations.append(Violation("driver_error", "", f"{type(exc).__name__}: {exc}"))
    finally:
        driver.close()
    result.failed_closed = len(driver.errors)
    result.notes.append(f"{plan.describe()}; {driver.restarts} restarts; downtime {downtime} ms")
    return result
