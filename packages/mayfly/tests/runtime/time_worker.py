"""A process for the downtime tests: creates a run that parks on an approval with a 2 s deadline, then exits.

Usage: python time_worker.py URL RUN_ID

The approval node waits for signal ``approval`` with ``timeout_ms=2000`` and
may not retry, so a wait that expires fails the run. The process exits as soon
as the run is durably parked; its last stdout line is ``parked <waiting>``.
"""

from __future__ import annotations

import sys
from typing import Any

from mayfly import HandlerRegistry, HandlerRequest, Node, RetryPolicy, Succeeded, WorkflowSpec
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.runtime import WaitForSignal, WorkflowRuntime, new_signal_token

DEADLINE_MS = 2_000

SPEC = WorkflowSpec(
    workflow_id="downtime.approval",
    version=1,
    nodes=(
        Node("draft", handler="draft@1"),
        Node("approval", handler="approval@1", depends_on=("draft",), retry=RetryPolicy(max_attempts=1)),
    ),
)


def approval(req: HandlerRequest) -> Any:
    if req.signal is None:
        return WaitForSignal("approval", new_signal_token(), timeout_ms=DEADLINE_MS)
    return Succeeded(output=req.signal.decision)


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()
    handlers.register("draft", 1, lambda req: Succeeded())
    handlers.register("approval", 1, approval)
    return handlers


def runtime(url: str) -> WorkflowRuntime:
    return WorkflowRuntime(LocalWorkflowJournal(url), registry(), leases=LocalLeaseStore(url))


def main() -> None:
    url, run_id = sys.argv[1:3]
    result = runtime(url).execute(SPEC, run_id=run_id)
    print("parked", ",".join(sorted(result.waiting)), flush=True)


if __name__ == "__main__":
    main()
