"""Fast rules: the hot events of a :class:`RunState`'s history, applied without the general machinery.

A replay is mostly ``NodeReady``, ``NodeStarted`` and ``NodeOutcomeCommitted``
on nodes that never wait, retry, call a child or take part in an edge. For
those, the rules below make exactly the changes the general rules of
:mod:`mayfly.reducer._apply` make, written straight against the state's own
fields instead of through :class:`~mayfly.reducer._apply.RunView` and
``_set_status``. Anything else — a check that fails, a budget about to run
out, a node with a :class:`~mayfly.model.state.NodeDetail`, an outcome that
is not an ordinary terminal one — is handed, before anything is changed, to
the general rule, which applies it or raises its :class:`CorruptionError`.
So the general rules stay the one definition of every check and message, and
``tests/reducer/test_fast.py`` shows both give equal states (indexes and
counters included) and equal errors over generated and corrupted histories.

Only the replay loops use these (:func:`mayfly.reducer.replay` and
:func:`mayfly.reducer.reduce_encoded`, which recovery runs):
:func:`~mayfly.reducer.reduce`, the live path, and a decision's draft take the
general rules, so every test that a replay equals the live state also compares
the fast rules with the general ones. The rules are closures over one state's
indexes (:func:`bind_fast_rules`), bound once per replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mayfly.model.events import LastOutcome, NodeOutcomeCommitted, NodeReady, NodeStarted
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import AttemptRecord, NodeStatus, RunState, count_terminal
from mayfly.reducer._apply import apply_event

__all__ = ["FastRule", "bind_fast_rules"]

FastRule = Callable[[Any, int], None]
"""Applies one event, committed at the given sequence, to the running state it was bound to."""

_PENDING = NodeStatus.PENDING
_READY = NodeStatus.READY
_RUNNING = NodeStatus.RUNNING
_SUCCEEDED = NodeStatus.SUCCEEDED

# Outcome kinds (besides success and permanent failure) that end a node's activation with a terminal
# status, and that status; keyed by the member's id, as hashing an Enum member is a Python-level call.
_TERMINAL_KIND = {
    id(NodeOutcomeKind.BLOCKED): NodeStatus.BLOCKED,
    id(NodeOutcomeKind.CANCELLED): NodeStatus.CANCELLED,
    id(NodeOutcomeKind.SKIPPED): NodeStatus.SKIPPED,
}
_KIND_SUCCEEDED = NodeOutcomeKind.SUCCEEDED
_PERMANENT_FAILURE = NodeOutcomeKind.PERMANENT_FAILURE
_FAILED = NodeStatus.FAILED


def bind_fast_rules(run: RunState) -> dict[type[Any], FastRule]:
    """The fast rule of each hot event type, bound to ``run`` (every other type takes the general rules).

    The rules hold ``run``'s indexes, which a state keeps for its lifetime, and
    must only be called while ``run`` is running (as :func:`apply_event` checks).
    """
    index = run.index
    nodes = run.nodes
    ready = run._ready
    parked = run._parked
    attempts = run._attempts
    active = run._active
    max_transitions = run.spec.budgets.max_transitions
    max_attempts = run.spec.budgets.max_attempts
    terminal_kind = _TERMINAL_KIND
    general = apply_event

    def node_ready(event: NodeReady, seq: int) -> None:
        i = index.get(event.node_id)
        node = None if i is None else nodes[i]
        if node is None or node.status is not _PENDING or run.transitions_used >= max_transitions:
            general(run, event, seq)
            return
        node.attempt = 0
        # _set_status(Pending -> Ready): the node stops being idle, and parked if it has no depends_on.
        run.n_idle -= 1
        if not node.prereqs:  # prereqs == len(spec.depends_on)
            parked.pop(node.index, None)
        node.status = _READY
        ready[node.index] = None
        run.transitions_used += 1
        run.sequence = seq

    def node_started(event: NodeStarted, seq: int) -> None:
        i = index.get(event.node_id)
        node = None if i is None else nodes[i]
        attempt_id = event.attempt_id
        if (
            node is None
            or node.status is not _READY
            or node.spec.child is not None
            or attempt_id in attempts
            or event.attempt != node.attempt + 1
            or run.attempts_used >= max_attempts
        ):
            general(run, event, seq)
            return
        # _set_status(Ready -> Running): it only leaves the ready index.
        del ready[node.index]
        node.status = _RUNNING
        node.attempt = event.attempt
        node.total_attempts += 1
        node.attempt_id = attempt_id
        node.attempt_deadline = event.deadline
        attempts[attempt_id] = AttemptRecord(attempt_id, node.spec.id)
        active[attempt_id] = node.index
        run.attempts_used += 1
        run.sequence = seq

    def outcome_committed(event: NodeOutcomeCommitted, seq: int) -> None:
        attempt_id = event.attempt_id
        i = index.get(event.node_id)
        node = None if i is None else nodes[i]
        record = None if attempt_id is None else attempts.get(attempt_id)
        outcome = event.outcome
        kind = outcome.kind
        if kind is _KIND_SUCCEEDED:
            status: NodeStatus | None = _SUCCEEDED
        elif kind is _PERMANENT_FAILURE:
            # Retried when the policy names it (is_retry_class): the general rule decides then.
            status = None if node is None or kind in node.spec.retry.retry_on else _FAILED
        else:
            status = terminal_kind.get(id(kind))
        if (
            node is None
            or record is None
            or status is None
            or node.detail is not None
            or node.status is not _RUNNING
            or node.attempt_id != attempt_id
            or record.outcome is not None
            or record.node_id != node.spec.id
        ):
            general(run, event, seq)
            return
        # close_attempt, then the node's activation ends (every field cleared here but the
        # attempt's lives in the node's detail, which this node does not have). The record keeps
        # its own id, the dict key's string, not the event's equal copy (one per attempt is kept).
        attempt_id = record.attempt_id
        attempts[attempt_id] = AttemptRecord(attempt_id, record.node_id, outcome, record.child_run_id)
        del active[attempt_id]
        node.attempt_id = None
        node.attempt_deadline = None
        node.last_outcome = outcome
        run.last_outcome = LastOutcome(record.node_id, kind, attempt_id)
        # _set_status(Running -> terminal): no retry to clear (no detail), one node less open.
        node.status = status
        run.open_nodes -= 1
        if status is _SUCCEEDED:
            # count_terminal for a success without edges: every dependent has one more succeeded prereq.
            for d in node.dependents:
                dep = nodes[d]
                dep.done_prereqs += 1
                dep.succeeded_prereqs += 1
        else:
            count_terminal(run, node)
        run.sequence = seq

    return {NodeReady: node_ready, NodeStarted: node_started, NodeOutcomeCommitted: outcome_committed}
