"""What follows from an outcome: edges fired, dependents settled, retries, budgets, the run's end.

``decide`` (:mod:`mayfly.reducer.decide`) turns a command into its primary
facts; the rules here add every consequence the ADR requires in the same
atomic batch, by applying each proposed event to a :class:`Draft` and
looking at the result: conditional edges fired, dependents released or
propagated, retries scheduled or the node explicitly failed, budgets
exhausted, parked nodes resolved, the run's terminal result.

When an activation ends (its final committed outcome: terminal, or
ChangesRequested, never an outcome that is then retried) the source's edges
are evaluated in specification order, then its dependents are settled.

A parked node (Pending with only edges to start it, or ChangesRequested
awaiting its correction) is resolved once provably no edge can activate it:
Skipped ("branch not selected"), or failed (``correction_unresolved``). Two
exact rules, neither a graph search: every incoming edge comes from a node
that finished and has no incoming edge itself (``closed_in``, checked when
that node settles), or the run is quiescent — every open node is idle, so no
outcome can ever arrive again (docs/transitions.md).

Every rule costs O(1) amortised per event it emits (counters and dependent
indexes, never a rescan of the graph), except quiescence, which visits the
parked nodes once per quiescence.
"""

from __future__ import annotations

from mayfly.model.events import (
    BudgetExhausted,
    BudgetKind,
    EdgeActivated,
    FailureCause,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
)
from mayfly.model.outcomes import Blocked, Cancelled, NodeOutcome, Skipped, Succeeded
from mayfly.model.state import NodeState, NodeStatus, RunStatus
from mayfly.reducer._apply import can_activate, run_result
from mayfly.reducer._draft import Draft
from mayfly.reducer.backoff import retry_delay
from mayfly.reducer.transitions import matches

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_CHANGES_REQUESTED = NodeStatus.CHANGES_REQUESTED
_PENDING = NodeStatus.PENDING
_RETRY_PENDING = NodeStatus.RETRY_PENDING
_RUN_RUNNING = RunStatus.RUNNING


__all__ = [
    "cancel_open_nodes",
    "commit_outcome",
    "exhaust_node",
    "exhaust_run",
    "finish",
    "make_ready",
    "transition_available",
]


# -- an outcome and the activation it ends --------------------------------------


def commit_outcome(draft: Draft, i: int, outcome: NodeOutcome, attempt_id: str | None) -> None:
    """Commit ``outcome`` on node ``i``, then what it causes: a retry decision, or edges and dependents."""
    node = draft.node(i)
    draft.emit(
        NodeOutcomeCommitted(node_id=node.node_id, outcome=outcome, attempt_id=attempt_id, at=draft.now)
    )
    node = draft.node(i)
    if node.status is _RETRY_PENDING:
        _decide_retry(draft, node)
    elif node.status is _CHANGES_REQUESTED:
        if not _fire_edges(draft, i):
            draft.emit(
                NodeFailed(
                    node_id=node.node_id,
                    cause=FailureCause.NO_CORRECTION_EDGE,
                    detail="changes requested, no correction edge matched",
                )
            )
        else:
            _close_if_unreachable(draft, i)
        _settle(draft, i)
        return
    if draft.node(i).status.is_terminal:
        # The activation ended (an outcome that is retried never gets here).
        _fire_edges(draft, i)
    _settle(draft, i)


def _fire_edges(draft: Draft, i: int) -> bool:
    """Fire the edges that the final outcome of node ``i``'s activation selects; whether any matched.

    Parallel edges fire in specification order; in an exclusive group at most
    one fires (validation proved at most one can match). A matching edge whose
    target is already active, or still awaits its dependency release, adds no
    activation: the target's own activation is in flight or to come.
    """
    node = draft.node(i)
    outcome = node.last_outcome
    detail = node.detail  # only a node with a detail has edges (read directly: most nodes have none)
    if detail is None or not detail.out_edges or outcome is None or draft.status is not _RUN_RUNNING:
        return False
    edges = draft.spec.edges
    matched = False
    groups: set[str] = set()
    for k in detail.out_edges:
        edge = edges[k]
        if edge.exclusive is not None and edge.exclusive in groups:
            continue
        if not matches(edge.when, outcome):
            continue
        matched = True
        if edge.exclusive is not None:
            groups.add(edge.exclusive)
        if not can_activate(draft.node(draft.index[edge.target])):
            continue
        if not transition_available(draft):
            break
        draft.emit(
            EdgeActivated(edge=k, source=node.node_id, target=edge.target, source_sequence=detail.outcome_seq)
        )
    return matched


def _decide_retry(draft: Draft, node: NodeState) -> None:
    policy = node.spec.retry
    outcome = node.last_outcome
    assert outcome is not None
    if outcome.kind not in policy.retry_on:
        draft.emit(
            NodeFailed(
                node_id=node.node_id,
                cause=FailureCause.NOT_RETRYABLE,
                detail=f"{outcome.kind.value} is not retried by this node's policy",
            )
        )
        return
    if node.attempt >= policy.max_attempts:
        draft.emit(
            NodeFailed(
                node_id=node.node_id,
                cause=FailureCause.RETRIES_EXHAUSTED,
                detail=f"{node.attempt} of {policy.max_attempts} attempts used",
            )
        )
        return
    limit = node.spec.max_attempts
    if limit is not None and node.total_attempts >= limit:
        exhaust_node(draft, node, limit, settle=False)
        return
    next_attempt = node.attempt + 1
    delay = retry_delay(
        policy,
        next_attempt,
        seed=draft.spec.jitter_seed,
        run_id=draft.run_id,
        node_id=node.node_id,
    )
    if not transition_available(draft):
        return
    draft.emit(
        RetryScheduled(
            node_id=node.node_id,
            next_attempt=next_attempt,
            delay_ms=delay,
            deadline=draft.now + delay,
        )
    )
    if delay == 0 and transition_available(draft):
        draft.emit(RetryReleased(node_id=node.node_id, next_attempt=next_attempt, at=draft.now))


def exhaust_node(draft: Draft, node: NodeState, limit: int, *, settle: bool = True) -> None:
    """Node-level exhaustion: record the fact, fail the node, then (unless told not to) settle it."""
    draft.emit(
        BudgetExhausted(
            kind=BudgetKind.NODE_ATTEMPTS,
            limit=limit,
            observed=limit + 1,
            node_id=node.node_id,
            last_outcome=draft.last_outcome,
        )
    )
    draft.emit(
        NodeFailed(
            node_id=node.node_id,
            cause=FailureCause.NODE_BUDGET_EXHAUSTED,
            detail=f"node attempt budget of {limit} exhausted",
        )
    )
    if settle:
        _settle(draft, node.index)


# -- releasing and propagating --------------------------------------------------


def _settle(draft: Draft, start: int) -> None:
    """Release or propagate the dependents of every node that just became terminal.

    Iterative, not recursive: a skip can cascade down a 100k-node chain.
    """
    work = [start]
    while work and draft.status is _RUN_RUNNING:
        i = work.pop()
        if not draft.node(i).status.is_terminal:
            continue
        for d in draft.node(i).dependents:
            dep = draft.node(d)
            if dep.status is not _PENDING:
                continue
            verdict = _policy_verdict(dep)
            if verdict is _RELEASE:
                if not make_ready(draft, d, "dependencies"):
                    return
            elif verdict is not None:
                draft.emit(NodeOutcomeCommitted(node_id=dep.node_id, outcome=verdict, at=draft.now))
                work.append(d)
        detail = draft.node(i).detail  # None: no edges (most nodes)
        if detail is not None and not detail.in_edges:
            # Its edges were evaluated (or never will be) and it can never run again.
            for t in detail.edge_targets:
                if _close_if_unreachable(draft, t):
                    work.append(t)


def _close_if_unreachable(draft: Draft, i: int) -> bool:
    """Resolve a parked node that no edge can ever activate again; whether it was resolved.

    Exact without a graph search: every incoming edge comes from a node that
    finished and has no incoming edge itself. Parked nodes on cycles wait for
    the quiescence rule in :func:`finish`.
    """
    node = draft.node(i)
    if node.closed_in != node.in_edges:
        return False
    if node.status is _PENDING and not node.spec.depends_on:
        draft.emit(
            NodeOutcomeCommitted(
                node_id=node.node_id, outcome=Skipped(reason="branch not selected"), at=draft.now
            )
        )
        return True
    if node.status is _CHANGES_REQUESTED:
        draft.emit(
            NodeFailed(
                node_id=node.node_id,
                cause=FailureCause.CORRECTION_UNRESOLVED,
                detail="changes requested, but no correction can re-activate the node",
            )
        )
        return True
    return False


_RELEASE = Succeeded()
"""Sentinel verdict: the dependency policy is met and the node becomes ready."""


def _policy_verdict(node: NodeState) -> NodeOutcome | None:
    """``_RELEASE`` to release, an outcome to propagate, or ``None`` while undecided.

    Propagation follows the terminal-result precedence (ARCHITECTURE section 11):
    any blocked prerequisite blocks, otherwise any cancelled one cancels,
    otherwise the dependent is skipped.
    """
    policy = node.spec.policy
    all_done = node.done_prereqs == node.prereqs
    if policy == "any_succeeded":
        if node.succeeded_prereqs:
            return _RELEASE
    elif all_done and (policy == "all_completed" or node.succeeded_prereqs == node.prereqs):
        return _RELEASE
    if not all_done:
        return None
    if node.blocked_prereqs:
        return Blocked(reason=f"a prerequisite is blocked ({policy} cannot be met)")
    if node.cancelled_prereqs:
        return Cancelled(reason=f"a prerequisite was cancelled ({policy} cannot be met)")
    return Skipped(reason=f"prerequisites did not succeed ({policy} cannot be met)")


def make_ready(draft: Draft, i: int, cause: str) -> bool:
    """Make node ``i`` ready, if a transition is left; whether it was (else the run is exhausted)."""
    if not transition_available(draft):
        return False
    draft.emit(NodeReady(node_id=draft.node(i).node_id, cause=cause))  # type: ignore[arg-type]
    return True


def transition_available(draft: Draft) -> bool:
    """Whether another transition fits the run's budget; exhausts the run when none does."""
    limit = draft.spec.budgets.max_transitions
    if draft.transitions_used < limit:
        return True
    exhaust_run(draft, BudgetKind.RUN_TRANSITIONS, limit, limit + 1)
    return False


# -- run-level ends -------------------------------------------------------------


def cancel_open_nodes(draft: Draft, reason: str) -> None:
    """Cancel every node that is not terminal yet, closing its active attempt if it has one."""
    outcome = Cancelled(reason=reason)
    for i in range(len(draft.spec.nodes)):
        node = draft.node(i)
        if not node.status.is_terminal:
            draft.emit(
                NodeOutcomeCommitted(
                    node_id=node.node_id, outcome=outcome, attempt_id=node.attempt_id, at=draft.now
                )
            )


def exhaust_run(draft: Draft, kind: BudgetKind, limit: int, observed: int) -> None:
    """Run-level exhaustion: cancel every open node, record the fact, fail the run."""
    last = draft.last_outcome
    cancel_open_nodes(draft, f"run budget exhausted ({kind.value})")
    draft.emit(BudgetExhausted(kind=kind, limit=limit, observed=observed, last_outcome=last))
    draft.emit(RunCompleted(result="failed", at=draft.now))


def finish(draft: Draft) -> None:
    """Resolve parked nodes once the run is quiescent; record the terminal result once all are terminal.

    Quiescent means every open node is idle (Pending or ChangesRequested):
    nothing is Ready, Running, Waiting or awaiting a retry, so no outcome can
    ever arrive and no edge can ever fire again. That is exact, needs no
    graph search, and costs O(parked nodes) once per quiescence.
    """
    while draft.status is _RUN_RUNNING and draft.open_nodes and draft.n_idle == draft.open_nodes:
        parked = draft.parked_nodes()
        if not parked:
            raise AssertionError(f"run {draft.run_id} is idle with open nodes but nothing parked")
        for i in parked:
            node = draft.node(i)
            if node.status is _CHANGES_REQUESTED:
                draft.emit(
                    NodeFailed(
                        node_id=node.node_id,
                        cause=FailureCause.CORRECTION_UNRESOLVED,
                        detail="changes requested, but no correction re-activated the node",
                    )
                )
            else:
                draft.emit(
                    NodeOutcomeCommitted(
                        node_id=node.node_id, outcome=Skipped(reason="branch not selected"), at=draft.now
                    )
                )
        for i in parked:
            _settle(draft, i)
    if draft.status is _RUN_RUNNING and draft.open_nodes == 0:
        draft.emit(RunCompleted(result=run_result(draft), at=draft.now))
