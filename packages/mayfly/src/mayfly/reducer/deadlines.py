"""When a run next falls due: the earliest retry release, attempt or wait deadline, or elapsed budget.

Pure (state only, no clock): the driver sleeps until it, and the run index
turns it into the wall-clock time a waiting run wakes at.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import NodeState

__all__ = ["DeadlineView", "next_deadline"]


class DeadlineView(Protocol):
    """What :func:`next_deadline` reads: a RunState, or a decision's draft (the run after its batch)."""

    @property
    def spec(self) -> WorkflowSpec: ...
    def node(self, index: int) -> NodeState: ...
    def pending_retries(self) -> Iterator[tuple[int, int]]: ...
    def waiting_nodes(self) -> list[NodeState]: ...


def next_deadline(
    state: DeadlineView, *, waits: bool = True, timed: Iterable[int] | None = None
) -> int | None:
    """The earliest virtual time something is due: a retry, an attempt or wait deadline, the elapsed budget.

    ``waits=False`` leaves out what only ends a parked run (a wait's expiry,
    the run's elapsed budget). ``timed`` lists the nodes whose spec sets an
    attempt deadline, when the caller keeps that list (only they can have
    one, so the scan need not visit every node).
    """
    deadlines = [deadline for _, deadline in state.pending_retries()]
    if timed is None:
        timed = (i for i, node in enumerate(state.spec.nodes) if node.retry.attempt_deadline_ms is not None)
    for index in timed:
        attempt_deadline = state.node(index).attempt_deadline
        if attempt_deadline is not None:
            deadlines.append(attempt_deadline)
    if waits:
        for node in state.waiting_nodes():
            if node.wait is not None and node.wait.deadline is not None:
                deadlines.append(node.wait.deadline)
        elapsed = state.spec.budgets.max_elapsed_ms
        if elapsed is not None:
            deadlines.append(elapsed)
    return min(deadlines) if deadlines else None
