"""Run time across downtime: a run's VirtualTime is the wall time elapsed since its epoch.

ARCHITECTURE section 11, "Time across downtime": the runtime records a run's
epoch in wall-clock milliseconds when it creates the run (``RunCreated.epoch_ms``),
and whoever drives the run next first advances its virtual time to
``wall now - epoch``, so a deadline that passed while no process ran fires at
once. A 24-hour approval window ends 24 hours after it opened, whoever is
running then.

- :func:`run_time_at` maps a wall-clock reading to the run's virtual time,
  clamped so that a wall clock that jumped backwards never moves it back.
- :func:`catch_up` records that advance one due deadline at a time, in
  deadline order, through the same facts a live driver records when each
  deadline's timer fires (``VirtualTimeAdvanced`` then the expiry or release),
  so a retry scheduled by an expiry during the downtime is itself released at
  its own deadline, not at the time the run was picked up again.

Both are what a driver (and a worker that wakes runs whose deadline passed)
calls before anything else; the reducer still reads no clock.

A run recorded before epochs existed has none: its virtual time counts only
the time some process was driving it, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mayfly.model.commands import AdvanceTime
from mayfly.model.state import RunState

__all__ = ["catch_up", "next_deadline", "run_time_at"]


def run_time_at(state: RunState, wall_ms: int) -> int:
    """The run's virtual time at wall-clock ``wall_ms``: time since its epoch, never before ``state.now``."""
    if state.epoch_ms is None:
        return state.now
    return max(state.now, wall_ms - state.epoch_ms)


def next_deadline(state: RunState, *, waits: bool = True, timed: Iterable[int] | None = None) -> int | None:
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


def catch_up(
    state: RunState,
    to: int,
    commit: Callable[[RunState, AdvanceTime], RunState],
    *,
    timed: Iterable[int] | None = None,
) -> RunState:
    """Advance a running run to virtual time ``to``, firing each deadline passed on the way at its own time.

    ``commit(state, command)`` durably commits one ``AdvanceTime`` against
    ``state`` and returns the new state.
    Each step advances to the next due deadline (the reducer fires every
    deadline at or before it, in deadline order), so what one expiry
    schedules is measured from that expiry; a last step records ``to``.
    Nothing is committed for a terminal run or when ``to`` is not ahead.
    """
    timed = None if timed is None else tuple(timed)
    while not state.status.is_terminal and to > state.now:
        deadline = next_deadline(state, timed=timed)
        # A deadline at or before the recorded time has already fired; never step to it again.
        step = to if deadline is None or deadline <= state.now or deadline >= to else deadline
        state = commit(state, AdvanceTime(step))
    return state
