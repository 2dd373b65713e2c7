"""The ``lease`` family: a second claimant for a run that a first owner is in the middle of driving.

Owner A drives a generated workflow with a short lease. At a seeded journal
operation of A's, inside the operation and before it reaches the store (so
in the middle of a commit), A is paused, as a stopped process is: its hub
does nothing while claimant B, another process (its own journal and lease
objects, on a thread of its own, joined before A goes on), tries to take the
run over.

- ``race``: B tries at once, while A's lease is live. B must be refused
  (``LeaseHeld``) and A finishes the run.
- ``stale``: A stays paused past its lease's TTL first. Where leases expire
  (memory, PostgreSQL, Redis, LMDB) B takes the run over and finishes it,
  re-invoking A's in-flight attempt under the same attempt id; when A wakes
  its pending commit must be refused by fencing (a typed error), never
  written next to B's. Where a lease is an flock held by a live process
  (the file journal) B is refused as in ``race``.

Either way the invariants must hold: one terminal outcome per attempt, no
acknowledged record lost, the fault-free result.
"""

from __future__ import annotations

import threading
import time

from mayfly.errors import AppendConflict, FencingRejected, LeaseHeld, LeaseLost, MayflyError
from mayfly.model.ids import DeterministicIdSource
from mayfly.runtime import WorkflowRuntime
from mayfly.substrate import VirtualClock
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

__all__ = ["LEASE_TTL_MS", "lease_family"]

LEASE_TTL_MS = 400
"""Owner A's lease TTL; a stale A stays paused 1.5 times as long before B claims the run."""
_FENCED = (FencingRejected, LeaseLost, AppendConflict, LeaseHeld)


def lease_family(ctx: SeedContext) -> SeedResult:
    """Pause owner A mid-commit while claimant B races it or takes the run over; A must be fenced."""
    rng = ctx.rng
    mode = rng.choice(["race", "stale"])
    workflow = generate_workflow(rng, signals=False, max_backoff_ms=1_000)
    reference = ctx.reference(workflow)
    backend = ctx.backend
    url = backend.url(ctx.seed)
    effects = EffectLog()
    registry = sim_registry(effects)
    at = rng.randrange(1, max(reference.operations, 2))
    result = SeedResult("lease")
    claimant: dict[str, object] = {}
    holder: list[SimDriver] = []
    run_ids: list[str] = []

    interrupted: list[str] = []

    def claim() -> None:
        interrupted.append(plan.last[0] if plan.last is not None else "")
        if mode == "stale":
            time.sleep(LEASE_TTL_MS * 1.5 / 1000)
        wall = holder[0].clock.wall_ms()

        def other_process() -> None:
            journal, leases = backend.open(url)
            try:
                runtime = WorkflowRuntime(
                    journal,
                    registry,
                    leases=leases,
                    ids=DeterministicIdSource((ctx.namespace + (1 << 31)) % (1 << 32)),
                    clock=lambda: VirtualClock(wall_origin_ms=wall),
                    owner="sim-claimant-b",
                    lease_ttl_ms=86_400_000,
                )
                claimant["result"] = runtime.resume(run_ids[0])
            except LeaseHeld as exc:
                claimant["refused"] = exc
            except BaseException as exc:
                claimant["error"] = exc
            finally:
                journal.close()
                leases.close()

        thread = threading.Thread(target=other_process, name="sim-claimant-b")
        thread.start()
        thread.join()  # A stays paused until B is done, as a stopped process would

    plan = FaultPlan(during={at: claim})
    driver = SimDriver(
        backend.opener(url),
        registry,
        plan=plan,
        effects=effects,
        ids=ctx.ids(),
        lease_ttl_ms=LEASE_TTL_MS,
    )
    holder.append(driver)
    run_id = driver.ids.new_id()
    run_ids.append(run_id)
    fenced: MayflyError | None = None
    try:
        try:
            driver.run(workflow.spec, workflow.input, run_id, workflow.events)
        except _FENCED as exc:
            fenced = exc  # A's stale commit was refused: correct; B finished the run (checked below)
        assert driver.journal is not None
        if "error" in claimant:
            error = claimant["error"]
            result.violations.append(Violation("claimant_error", run_id, f"{type(error).__name__}: {error}"))
        result.violations.extend(
            check_invariants(
                driver.journal.inner,
                {run_id: reference.expected},
                acknowledged=effects.acked,
                effects=effects,
            )
        )
    except Exception as exc:
        result.violations.append(Violation("driver_error", run_id, f"{type(exc).__name__}: {exc}"))
    finally:
        driver.close()
    took_over = "result" in claimant
    if took_over and fenced is None and interrupted[:1] in (["append"], ["append_indexed"]):
        # B took the run over while A was inside a commit, yet A's commit was not refused: two owners wrote.
        result.violations.append(
            Violation(
                "two_owners", run_id, "the stale owner kept committing after another owner took the run over"
            )
        )
    result.failed_closed += int("refused" in claimant) + int(fenced is not None)
    state = "took over" if took_over else "was refused" if "refused" in claimant else "did not run"
    result.notes.append(f"{mode} at operation {at}: B {state}; A {'fenced' if fenced else 'not fenced'}")
    return result
