"""One commit per node in a chain: a node's outcome and the start of what it makes ready share one append.

ADR-0032 asks that the dispatch fact be committed before the handler runs
and the success fact before any dependent sees it; both still hold when the
two facts are one batch. Each test checks those orders from the journal
itself, not only the commit count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mayfly import HandlerRegistry, Node, RetryableFailure, Succeeded, WorkflowSpec
from mayfly.local import LocalWorkflowJournal
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted
from mayfly.model.spec import RetryPolicy
from mayfly.reducer import decode_event
from mayfly.runtime import WorkflowRuntime


def chain(length: int, handler: str = "probe@1", **node: Any) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=handler, depends_on=(f"n{i - 1}",) if i else (), **node) for i in range(length)
    )
    return WorkflowSpec(workflow_id="one.commit", version=1, nodes=nodes)


def events(url: str, run_id: str) -> list[Any]:
    with LocalWorkflowJournal(url) as journal:
        return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def test_a_chain_costs_one_commit_per_node_and_keeps_the_adr_orders(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    seen: list[tuple[str, list[str]]] = []

    def probe(req: Any) -> Any:
        # Read the journal from another instance, as a crash would leave it: this attempt's start is
        # already durable, and so is the outcome of the node it depends on.
        with LocalWorkflowJournal(url) as journal:
            history = [
                decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(req.run_id)
            ]
        seen.append((req.attempt_id, [type(e).__name__ for e in history]))
        started = {e.attempt_id for e in history if isinstance(e, NodeStarted)}
        assert req.attempt_id in started
        if req.node_id != "n0":
            done = {e.node_id for e in history if isinstance(e, NodeOutcomeCommitted)}
            assert f"n{int(req.node_id[1:]) - 1}" in done
        return Succeeded(output={"n": req.node_id})

    registry = HandlerRegistry()
    registry.register("probe", 1, probe)
    commits: list[int] = []
    runtime = WorkflowRuntime(url, registry, observer=lambda state, batch: commits.append(len(batch)))
    result = runtime.execute(chain(40))
    assert result.status.value == "succeeded"
    assert len(seen) == 40
    # Creating the run, starting n0, then each node's outcome with the next node's start (the last
    # outcome ends the run): 40 nodes, 42 commits, where a commit for the start and another for the
    # outcome of every node made 81.
    assert len(commits) == 42 <= 1.05 * 40
    assert commits[2:-1] == [3] * 39  # outcome, readiness of the next node, and its start
    history = events(url, result.run_id)
    assert sum(isinstance(e, NodeStarted) for e in history) == 40
    assert sum(isinstance(e, NodeOutcomeCommitted) for e in history) == 40


def test_an_immediate_retry_starts_in_the_batch_of_the_failure(tmp_path: Path) -> None:
    """A retryable failure with no backoff records the next attempt's start with the failure."""
    url = f"file://{tmp_path}/store?durability=write"
    calls: list[int] = []

    def flaky(req: Any) -> Any:
        calls.append(req.attempt)
        return RetryableFailure(reason="once") if req.attempt == 1 else Succeeded()

    registry = HandlerRegistry()
    registry.register("flaky", 1, flaky)
    runtime = WorkflowRuntime(url, registry)
    result = runtime.execute(chain(3, "flaky@1", retry=RetryPolicy(max_attempts=2)))
    assert result.status.value == "succeeded"
    assert calls == [1, 2, 1, 2, 1, 2]
    history = events(url, result.run_id)
    attempts = [(e.node_id, e.attempt) for e in history if isinstance(e, NodeStarted)]
    assert attempts == [(f"n{i}", a) for i in range(3) for a in (1, 2)]
