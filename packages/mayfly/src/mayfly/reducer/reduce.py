"""``reduce(state, event, sequence)``: derive state from committed history, total and fail-closed."""

from __future__ import annotations

from collections.abc import Iterable

from mayfly.model.errors import CorruptionError
from mayfly.model.events import Event, RunCreated
from mayfly.model.state import RunState
from mayfly.reducer._apply import apply_event, new_state

__all__ = ["reduce", "replay"]


def reduce(state: RunState | None, event: Event, sequence: int) -> RunState:
    """Apply ``event``, committed at ``sequence``, and return the new state.

    The state is updated in place (see :mod:`mayfly.model.state` for why);
    ``None`` means "before the run exists" and must be followed by
    ``RunCreated`` at sequence 1. Contradictory history raises
    :class:`CorruptionError` and leaves the error's sequence unapplied.
    """
    if state is None:
        if not isinstance(event, RunCreated) or sequence != 1:
            raise CorruptionError(
                f"history must start with RunCreated at sequence 1, "
                f"found {type(event).__name__} at {sequence}"
            )
        return new_state(event)
    if sequence != state.sequence + 1:
        raise CorruptionError(
            f"history of run {state.run_id} has a gap: expected sequence {state.sequence + 1}, "
            f"found {sequence}"
        )
    apply_event(state, event, sequence)
    return state


def replay(events: Iterable[Event], state: RunState | None = None) -> RunState:
    """Reduce ``events`` in order, numbering them after ``state``'s sequence (1 for a new run)."""
    sequence = 0 if state is None else state.sequence
    for event in events:
        sequence += 1
        state = reduce(state, event, sequence)
    if state is None:
        raise CorruptionError("cannot replay an empty history")
    return state
