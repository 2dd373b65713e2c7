"""A worker process for the group-commit crash test: many runs driven at once on one hub.

Usage: python group_crash_worker.py URL RUNS_FILE ACKS_FILE {create|resume} OWNER [LEASE_TTL_MS]

``create`` starts every run listed in RUNS_FILE (one id a line) and drives
them all concurrently, one hub task each, so their appends meet in group
flushes. After each acknowledged commit the task appends ``ack RUN SEQUENCE
EVENT_ID`` lines to ACKS_FILE and fsyncs it, so the parent knows every
record that was acknowledged before the process died. The parent sets
``MAYFLY_TEST_KILL_AFTER_GROUP_FLUSH`` so that the process kills itself with
SIGKILL between a group flush and its acknowledgements. ``resume`` resumes
every listed run (reconciling in-flight attempts) and drives it to the end,
printing ``done RUN STATUS`` (``absent`` for a run whose creation was never
committed).
"""

from __future__ import annotations

import os
import sys

from mayfly.commit import commit_command
from mayfly.errors import LeaseHeld
from mayfly.identity import Uuid7IdSource
from mayfly.model.commands import AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, WorkflowSpec
from mayfly.model.state import RunState
from mayfly.plugins import open_journal, open_leases
from mayfly.recovery import DispatchReady, ReconcileAttempt, resume_run
from mayfly.substrate import Hub, offload, sleep, spawn

NODES = 12
SPEC = WorkflowSpec(
    workflow_id="crash.group",
    version=1,
    nodes=tuple(
        Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else (), retry=RetryPolicy())
        for i in range(NODES)
    ),
)


def main() -> None:
    url, runs_file, acks_file, mode, owner = sys.argv[1:6]
    # A store whose leases expire (PostgreSQL) gets a short TTL, so the resumer need not wait long.
    ttl_ms = int(sys.argv[6]) if len(sys.argv) > 6 else 60_000
    with open(runs_file) as listing:
        runs = listing.read().split()
    journal, leases = open_journal(url), open_leases(url)
    ids = Uuid7IdSource()
    acks = os.open(acks_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def commit(state: RunState | None, command: object, fence: int | None) -> RunState:
        result = commit_command(journal, state, command, ids=ids, fence=fence)  # type: ignore[arg-type]
        lines = "".join(f"ack {r.run_id} {r.sequence} {r.event_id}\n" for r in result.records)
        os.write(acks, lines.encode())
        offload(os.fsync, acks)
        return result.state

    def drive(run_id: str) -> str:
        if mode == "create":
            state = commit(None, CreateRun(run_id=run_id, spec=SPEC), None)  # type: ignore[arg-type]
            lease = leases.acquire(run_id, owner, ttl_ms)
            fence = lease.fencing_token
        elif journal.next_sequence(run_id) == 1:
            return "absent"  # its creation was never committed (nor acknowledged): nothing to resume
        else:
            while True:
                try:
                    session = resume_run(journal, leases, run_id, owner=owner)
                    break
                except LeaseHeld:
                    sleep(0.2)  # the killed owner's lease has not expired yet
            state, fence = session.state, session.fence
            for effect in session.effects:
                if isinstance(effect, ReconcileAttempt):
                    # The step is idempotent under its key, so reconciling means completing it again.
                    state = commit(
                        state, CompleteAttempt(effect.node_id, effect.attempt_id, Succeeded()), fence
                    )
                elif not isinstance(effect, DispatchReady):
                    raise AssertionError(f"unexpected recovery effect {effect}")
        while not state.status.is_terminal:
            for node_id in state.ready_nodes():
                attempt = ids.new_id()
                state = commit(state, StartNodes((AttemptStart(node_id, attempt),)), fence)
                state = commit(
                    state, CompleteAttempt(node_id, attempt, Succeeded(output={"node": node_id})), fence
                )
        return str(state.status.value)

    def everything() -> list[str]:
        tasks = [spawn(drive, run_id, name=f"run-{run_id}") for run_id in runs]
        return [task.join() for task in tasks]

    for run_id, status in zip(runs, Hub(offload_workers=16).run(everything), strict=True):
        print(f"done {run_id} {status}", flush=True)
    journal.close()


if __name__ == "__main__":
    main()
