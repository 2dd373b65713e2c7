"""Contract clauses of what a run costs the backend: one commit per node of a chain, in ADR-0032's order.

Issue 18 asks that a chain cost at most 1.05 commits per node on every
backend: a node's outcome, the readiness it causes and the start of the next
attempt are one append. Merging them must not weaken ADR-0032's orders: an
attempt's ``NodeStarted`` is durable before its handler runs, and a
dependency's outcome is committed before its dependent starts. Both are
checked from the journal itself (a second instance opened by URL, as another
process or a crash would find it), and the commit count from the runtime's
observer, whose batches must be exactly the journal's history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.events import NodeOutcomeCommitted, NodeStarted
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.model.state import RunStatus
from mayfly.plugins import open_journal
from mayfly.reducer import decode_event
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly.substrate import VirtualClock

CHAIN = 40
MAX_COMMITS_PER_NODE = 1.05


@dataclass
class ChainProbe:
    """What one chain run showed: each handler's view of the journal, the observer's batches, the history."""

    run_id: str = ""
    status: RunStatus | None = None
    # Per invocation: (node id, attempt id, attempt ids started and node ids with an outcome, as read).
    seen: list[tuple[str, str, set[str], set[str]]] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)  # event type names of each commit
    history: list[Any] = field(default_factory=list)  # the journal's events, in sequence order


def _events(journal: WorkflowJournal, run_id: str) -> list[Any]:
    return [decode_event(r.event_type, r.schema_version, r.payload) for r in journal.read(run_id)]


def run_chain(
    journal: WorkflowJournal, leases: RecoveryLeaseStore, url: str, run_id: str, length: int = CHAIN
) -> ChainProbe:
    """Run a chain of ``length`` cooperative handlers on ``journal``; each reads the run back by ``url``."""
    probe = ChainProbe(run_id=run_id)
    reader = open_journal(url)  # another instance: it sees what is committed, not what a cache holds

    def look(request: HandlerRequest) -> Succeeded:
        history = _events(reader, request.run_id)
        started = {e.attempt_id for e in history if isinstance(e, NodeStarted)}
        finished = {e.node_id for e in history if isinstance(e, NodeOutcomeCommitted)}
        probe.seen.append((request.node_id, request.attempt_id, started, finished))
        return Succeeded(output={"node": request.node_id})

    registry = HandlerRegistry()
    registry.register("contract-look", 1, look, cooperative=True)

    def observe(state: Any, batch: Any) -> None:
        probe.batches.append([type(event).__name__ for event in batch])

    nodes = tuple(
        Node(f"n{i}", handler="contract-look@1", depends_on=(f"n{i - 1}",) if i else ())
        for i in range(length)
    )
    spec = WorkflowSpec(workflow_id="contract.commits.chain", version=1, nodes=nodes)
    # Virtual time, started at the wall time: under the real clock a millisecond that passes between
    # creating the run and driving it is committed as a VirtualTimeAdvanced of its own, so a loaded
    # machine would add a commit. The clause counts what the chain costs, not how busy the host was.
    runtime = WorkflowRuntime(
        journal,
        registry,
        leases=leases,
        owner="contract-commits",
        observer=observe,
        clock=lambda: VirtualClock(wall_origin_ms=int(time.time() * 1000)),
    )
    try:
        probe.status = runtime.execute(spec, run_id=run_id).status
        probe.history = _events(reader, run_id)
    finally:
        reader.close()
    return probe


@pytest.mark.clause("runtime.commit.one-per-node")
def test_a_chain_costs_at_most_one_commit_per_node(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, mayfly_journal_url: str, run_id: str
) -> None:
    """A 40-node chain commits at most 1.05 times per node; the observer's batches are the history."""
    probe = run_chain(mayfly_journal, mayfly_leases, mayfly_journal_url, run_id)
    assert probe.status is RunStatus.SUCCEEDED
    # The observer saw every commit and nothing else: its batches, in order, are the history.
    assert [name for batch in probe.batches for name in batch] == [type(e).__name__ for e in probe.history]
    commits = len(probe.batches)
    assert commits <= MAX_COMMITS_PER_NODE * CHAIN, (
        f"a {CHAIN}-node chain took {commits} commits ({commits / CHAIN:.2f} per node, at most "
        f"{MAX_COMMITS_PER_NODE}); batch sizes {[len(b) for b in probe.batches]}"
    )
    assert sum(isinstance(e, NodeStarted) for e in probe.history) == CHAIN
    assert sum(isinstance(e, NodeOutcomeCommitted) for e in probe.history) == CHAIN


@pytest.mark.clause("runtime.commit.adr-order")
def test_one_commit_per_node_keeps_the_adr_orders(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, mayfly_journal_url: str, run_id: str
) -> None:
    """A node's start is durable before its handler runs, and its dependency's outcome before it starts."""
    probe = run_chain(mayfly_journal, mayfly_leases, mayfly_journal_url, run_id)
    assert probe.status is RunStatus.SUCCEEDED
    assert [node for node, *_ in probe.seen] == [f"n{i}" for i in range(CHAIN)]
    for node, attempt, started, finished in probe.seen:
        assert attempt in started, f"{node}: its handler ran before its NodeStarted ({attempt}) was committed"
        if node != "n0":
            before = f"n{int(node[1:]) - 1}"
            assert before in finished, f"{node}: its handler ran before the outcome of {before} was committed"
    # In the history too: each node's start follows its dependency's outcome.
    position = {
        (type(e).__name__, e.node_id): i
        for i, e in enumerate(probe.history)
        if isinstance(e, (NodeStarted, NodeOutcomeCommitted))
    }
    for i in range(1, CHAIN):
        assert position["NodeOutcomeCommitted", f"n{i - 1}"] < position["NodeStarted", f"n{i}"]
