"""``reduce(state, event, sequence)``: derive state from committed history, total and fail-closed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import msgspec

from mayfly.model.errors import CorruptionError
from mayfly.model.events import Event, RunCreated
from mayfly.model.state import RunState, RunStatus
from mayfly.reducer._apply import apply_event, new_state
from mayfly.reducer._fast import FAST_RULES
from mayfly.reducer.codec import Upcaster, current_decoders, decode_event

__all__ = ["EncodedRecord", "reduce", "reduce_encoded", "replay"]

_RUN_RUNNING = RunStatus.RUNNING
_DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)


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
    rule = FAST_RULES.get(type(event))
    if rule is None or state.status is not _RUN_RUNNING:
        apply_event(state, event, sequence)
    else:
        rule(state, event, sequence)
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


class EncodedRecord(Protocol):
    """What :func:`reduce_encoded` reads of a stored record (a journal record has these fields)."""

    @property
    def sequence(self) -> int: ...
    @property
    def event_type(self) -> str: ...
    @property
    def schema_version(self) -> int: ...
    @property
    def payload(self) -> bytes: ...


def reduce_encoded(
    state: RunState | None,
    records: Iterable[EncodedRecord],
    *,
    out_of_order: Callable[[int, int], Exception],
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> RunState | None:
    """Decode and reduce ``records``, which must follow ``state`` (``None``: from the first record).

    Exactly :func:`decode_event` then :func:`reduce` for each record, fused
    into one loop: a payload at its type's current version is decoded
    directly, and a hot event is applied by its fast rule, so a long replay
    does not pay several calls and type checks per event. A record whose
    sequence does not follow the previous one raises
    ``out_of_order(sequence, previous)``. Returns ``state`` unchanged (maybe
    ``None``) when there are no records.
    """
    decoders = current_decoders()
    rules = FAST_RULES
    running = _RUN_RUNNING
    after = 0 if state is None else state.sequence
    for record in records:
        sequence = record.sequence
        if sequence != after + 1:
            raise out_of_order(sequence, after)
        event_type = record.event_type
        known = decoders.get(event_type)
        if known is not None and known[0] == record.schema_version:
            try:
                event = known[1](record.payload)
            except _DECODE_ERRORS:
                # Decoded again the general way, only to raise the error it deserves.
                event = decode_event(event_type, record.schema_version, record.payload, upcasters=upcasters)
        else:
            event = decode_event(event_type, record.schema_version, record.payload, upcasters=upcasters)
        rule = rules.get(type(event))
        if rule is None or state is None or state.status is not running:
            state = reduce(state, event, sequence)
        else:
            rule(state, event, sequence)
        after = sequence
    return state
