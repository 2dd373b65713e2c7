"""A worker process for the adversarial runtime tests: drives one run with WorkflowRuntime, killing itself on cue.

Usage: python adversarial_worker.py URL RUN_ID {execute|resume} KILL_AT LOG

``KILL_AT`` is where the process SIGKILLs itself: ``started`` (StartNodes is
durable, before the handler runs), ``handler`` (inside the handler),
``returned`` (the handler returned; the batch carrying its outcome is about to
be appended), ``wait`` (the OpenSignalWait batch is about to be appended),
``backoff`` (a retry was scheduled and is waiting for its delay) or ``none``.
Every handler invocation appends ``node attempt_id idempotency_key attempt
run_now`` to ``LOG``; the final line on stdout is ``done <status> <waiting>``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from mayfly import (
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    RetryableFailure,
    RetryPolicy,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.events import Event, RetryScheduled
from mayfly.model.signals import SignalToken
from mayfly.model.state import RunState
from mayfly.runtime import WaitForSignal

TOKEN = "adversarial-token-0123456789"
BACKOFF_MS = 800

SPEC = WorkflowSpec(
    workflow_id="adversarial.crash",
    version=1,
    nodes=(
        Node("a", handler="step@1"),
        Node(
            "flaky",
            handler="flaky@1",
            depends_on=("a",),
            retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(delay_ms=BACKOFF_MS)),
        ),
        Node("gate", handler="gate@1", depends_on=("flaky",)),
        Node("z", handler="step@1", depends_on=("gate",)),
    ),
)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillingJournal:
    """The local journal, except that the process dies just before appending a batch of a chosen type."""

    def __init__(self, inner: LocalWorkflowJournal, kill_before: str | None) -> None:
        self._inner = inner
        self._kill_before = kill_before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def append(self, run_id: str, first: int, records: Sequence[JournalRecord], fence: int | None) -> Any:
        if self._kill_before is not None and any(r.event_type == self._kill_before for r in records):
            die()
        return self._inner.append(run_id, first, records, fence)

    def append_indexed(
        self, run_id: str, first: int, records: Sequence[JournalRecord], fence: int | None, index: Any
    ) -> Any:
        # The local journal keeps the run index, so the runtime appends through here.
        if self._kill_before is not None and any(r.event_type == self._kill_before for r in records):
            die()
        return self._inner.append_indexed(run_id, first, records, fence, index)


def main() -> None:
    url, run_id, mode, kill_at, log = sys.argv[1:6]
    kill_before = {"returned": "NodeOutcomeCommitted", "wait": "SignalWaitOpened"}.get(kill_at)
    if mode == "resume":
        kill_at, kill_before = "none", None
    registry = HandlerRegistry()

    def record(req: HandlerRequest) -> None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{req.node_id} {req.attempt_id} {req.idempotency_key} {req.attempt}\n")

    @registry.handler("step")
    def step(req: HandlerRequest) -> Succeeded:
        record(req)
        if kill_at == "handler" and req.node_id == "a":
            die()
        return Succeeded(output={"node": req.node_id})

    @registry.handler("flaky")
    def flaky(req: HandlerRequest) -> Succeeded | RetryableFailure:
        record(req)
        if req.attempt == 1:
            return RetryableFailure(reason="transient")
        return Succeeded(output={"attempt": req.attempt})

    @registry.handler("gate")
    def gate(req: HandlerRequest) -> Succeeded | WaitForSignal:
        record(req)
        if req.signal is None:
            return WaitForSignal("go", SignalToken(TOKEN))
        return Succeeded(output=req.signal.decision)

    def observer(state: RunState, events: tuple[Event, ...]) -> None:
        names = {type(e).__name__ for e in events}
        if kill_at == "started" and "NodeStarted" in names and state.node_by_id("a").attempt_id:  # type: ignore[union-attr]
            die()
        if kill_at == "backoff" and any(isinstance(e, RetryScheduled) for e in events):
            die()

    journal = KillingJournal(LocalWorkflowJournal(url), kill_before)
    runtime = WorkflowRuntime(journal, registry, leases=LocalLeaseStore(url), observer=observer)  # type: ignore[arg-type]
    result = runtime.execute(SPEC, run_id=run_id) if mode == "execute" else runtime.resume(run_id)
    print(f"done {result.status.value} {','.join(result.waiting)}", flush=True)


if __name__ == "__main__":
    main()
