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
from mayfly.reducer.deadlines import next_deadline

__all__ = ["PICKUP_LAG_MS", "catch_up", "next_deadline", "run_time_at"]

# next_deadline lives with the reducer (it is pure and the run index needs it); re-exported here.


def run_time_at(state: RunState, wall_ms: int) -> int:
    """The run's virtual time at wall-clock ``wall_ms``: time since its epoch, never before ``state.now``."""
    if state.epoch_ms is None:
        return state.now
    return max(state.now, wall_ms - state.epoch_ms)


def catch_up(
    state: RunState,
    to: int,
    commit: Callable[[RunState, AdvanceTime], RunState],
    *,
    timed: Iterable[int] | None = None,
    lag_ms: int = 0,
) -> RunState:
    """Advance a running run to virtual time ``to``, firing each deadline passed on the way at its own time.

    ``commit(state, command)`` durably commits one ``AdvanceTime`` against
    ``state`` and returns the new state.
    Each step advances to the next due deadline (the reducer fires every
    deadline at or before it, in deadline order), so what one expiry
    schedules is measured from that expiry; a last step records ``to``.
    Nothing is committed for a terminal run or when ``to`` is not ahead, nor
    when ``to`` is less than ``lag_ms`` ahead and no deadline falls due by
    then: a driver picking a run up passes :data:`PICKUP_LAG_MS`, since it
    records the time itself wherever it decides something (before a retry's
    delay is measured, an attempt with a deadline starts, a wait opens, or a
    signal finds its wait's deadline passed). So a worker claiming a run
    just started costs no commit for the milliseconds since, while a run
    picked up after downtime still records when that happened.
    """
    timed = None if timed is None else tuple(timed)
    while not state.status.is_terminal and to > state.now:
        deadline = next_deadline(state, timed=timed)
        if to - state.now < lag_ms and (deadline is None or deadline > to):
            break  # a short advance that fires nothing
        # A deadline at or before the recorded time has already fired; never step to it again.
        step = to if deadline is None or deadline <= state.now or deadline >= to else deadline
        state = commit(state, AdvanceTime(step))
    return state


PICKUP_LAG_MS = 1_000
"""How far behind a driver may leave a run's recorded time when it picks the run up (see :func:`catch_up`)."""
