"""A worker process for crash tests: drives one run through commit_command, printing acknowledgements.

Usage: python crash_worker.py URL RUN_ID {create|resume} OWNER

Each committed record is printed as ``ack <sequence> <event_id>`` right after
the journal acknowledged it, so the parent knows exactly what was durable when
it sends SIGKILL.
"""

from __future__ import annotations

import sys

from mayfly.commit import commit_command
from mayfly.identity import Uuid7IdSource
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, WorkflowSpec
from mayfly.model.state import RunState
from mayfly.recovery import DispatchReady, ReconcileAttempt, resume_run

SPEC = WorkflowSpec(
    workflow_id="crash.chain",
    version=1,
    nodes=tuple(
        Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else (), retry=RetryPolicy())
        for i in range(40)
    ),
)


def main() -> None:
    url, run_id, mode, owner = sys.argv[1:5]
    journal, leases = LocalWorkflowJournal(url), LocalLeaseStore(url)
    ids = Uuid7IdSource()

    def commit(state: RunState | None, command: object, fence: int) -> RunState:
        result = commit_command(journal, state, command, ids=ids, fence=fence)  # type: ignore[arg-type]
        for record in result.records:
            print(f"ack {record.sequence} {record.event_id}", flush=True)
        return result.state

    if mode == "create":
        state = commit(None, CreateRun(run_id=run_id, spec=SPEC), fence=None)  # type: ignore[arg-type]
        lease = leases.acquire(run_id, owner, 60_000)
        fence = lease.fencing_token
    else:
        session = resume_run(journal, leases, run_id, owner=owner)
        state, fence = session.state, session.fence
        for effect in session.effects:
            if isinstance(effect, ReconcileAttempt):
                # The step is idempotent under its key, so reconciling means completing it again.
                print(f"reconcile {effect.node_id} {effect.attempt_id} {effect.idempotency_key}", flush=True)
                state = commit(state, CompleteAttempt(effect.node_id, effect.attempt_id, Succeeded()), fence)
            elif not isinstance(effect, DispatchReady):
                raise AssertionError(f"unexpected recovery effect {effect}")
    while not state.status.is_terminal:
        for node_id in state.ready_nodes():
            attempt = ids.new_id()
            state = commit(state, StartNodes((AttemptStart(node_id, attempt),)), fence)
            state = commit(
                state, CompleteAttempt(node_id, attempt, Succeeded(output={"node": node_id})), fence
            )
    print(f"done {state.status.value}", flush=True)


if __name__ == "__main__":
    main()
