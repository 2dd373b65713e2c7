"""The simulator's process families on the file backend, and the cross-process effect log they check.

One seed of ``sigkill`` (a worker process SIGKILLed after seeded record
counts, then replaced) and one of ``workers`` (two worker processes under a
queue limit, one SIGKILLed) run through the campaign driver on real files.
The effect log test shows that what workers write to it reaches
``check_invariants``: a forged late re-invocation and a forged acknowledged
record the store does not hold are both reported. The attempt numbering check
passes retries and catches a history with a hole.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

from mayfly import Node, RetryPolicy, WorkflowSpec
from mayfly.plugins import open_journal, open_leases
from mayfly.runtime import WorkflowRuntime
from mayfly.testing import (
    EffectLog,
    FaultJournal,
    FaultPlan,
    MemoryStore,
    SimDriver,
    check_invariants,
    sim_registry,
)
from mayfly_contract.sim import run_campaign
from mayfly_contract.sim._procs import (
    FileEffects,
    attempt_numbering,
    read_effects,
    sigkill_seed,
    workers_seed,
)


def test_a_sigkill_seed_through_the_campaign_driver(tmp_path: Path) -> None:
    out = io.StringIO()
    campaign = run_campaign("file", [0], family="sigkill", directory=tmp_path, out=out)
    assert campaign.results[0].family == "sigkill"
    assert campaign.violations == 0, out.getvalue()
    assert out.getvalue().endswith("1 seeds, 0 violations\n")


def test_a_sigkill_seed_kills_a_worker_and_checks_its_effects(tmp_path: Path) -> None:
    found = sigkill_seed(1, "file", tmp_path)
    assert found.violations == [], found.violations
    assert found.faults["sigkill"] >= 1, found.detail
    assert "0 invocations" not in found.detail, found.detail


def test_a_workers_seed_shares_runs_between_worker_processes(tmp_path: Path) -> None:
    found = workers_seed(0, "file", tmp_path, workers=2)
    assert found.violations == [], found.violations
    assert found.faults.get("kill", 0) >= 1, found.detail


def test_the_effect_log_of_worker_processes_reaches_the_checker(tmp_path: Path) -> None:
    """What FileEffects wrote is checked: a run's real history passes, forged lines are caught."""
    url = f"file://{tmp_path / 'journal'}"
    log = tmp_path / "effects.jsonl"
    effects = FileEffects(log, worker=0)
    spec = WorkflowSpec("sim.effects", 1, (Node("a", handler="sim.step@1", input={"b": "ok", "v": 5}),))
    journal = FaultJournal(open_journal(url), FaultPlan(), effects)
    runtime = WorkflowRuntime(journal, sim_registry(effects), leases=open_leases(url))
    result = runtime.execute(spec, {"seed": 1})
    assert result.status.value == "succeeded"
    run = result.run_id
    parsed, acked = read_effects(log)
    assert len(parsed.invocations) == 1 and len(acked[run]) == len(journal.read(run))
    assert check_invariants(journal.inner, {run: None}, acknowledged=acked, effects=parsed) == []

    invoked = next(json.loads(line) for line in log.read_text().splitlines() if '"invoked"' in line)
    late = {**invoked, "i": 99, "t": time.monotonic_ns()}  # the succeeded attempt, invoked again later
    forged = {"k": "acked", "run": run, "r": [[len(acked[run]) + 1, "0" * 8]], "s": [], "w": 0, "t": 0}
    with log.open("a") as out:
        out.write(json.dumps(late) + "\n" + json.dumps(forged) + "\n")
    parsed, acked = read_effects(log)
    kinds = {v.kind for v in check_invariants(journal.inner, {run: None}, acknowledged=acked, effects=parsed)}
    assert kinds == {"reinvoked_after_success", "lost_ack"}
    journal.close()
    runtime.leases.close()


class _Without:
    """A journal's reads with one record left out (a history with a hole, for the checker)."""

    def __init__(self, journal: Any, drop: int) -> None:
        self.journal, self.drop = journal, drop

    def read(self, run_id: str) -> list[Any]:
        return [r for r in self.journal.read(run_id) if r.sequence != self.drop]


def test_attempt_numbering_passes_retries_and_catches_a_gap() -> None:
    spec = WorkflowSpec(
        "sim.numbering",
        1,
        (Node("a", handler="sim.step@1", input={"b": "flaky", "v": 1, "fails": 2}, retry=RetryPolicy(3)),),
    )
    store = MemoryStore()
    driver = SimDriver(lambda: (store.journal(), store.leases()), sim_registry(EffectLog()))
    run = "00000000-0000-0000-0000-0000000000aa"
    assert driver.run(spec, {"seed": 1}, run).status.value == "succeeded"
    journal = store.journal()
    assert attempt_numbering(journal, [run]) == []
    second = next(
        r.sequence for r in journal.read(run) if r.event_type == "NodeStarted" and b'"attempt":2' in r.payload
    )
    found = attempt_numbering(_Without(journal, second), [run])
    assert [v.message for v in found] == ["a started attempt 3 after attempt 1"]
    driver.close()
