"""``reduce(state, event, sequence)``: derive state from committed history, total and fail-closed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import msgspec

from mayfly.model.errors import CorruptionError
from mayfly.model.events import EVENT_TYPES, Event, RunCreated
from mayfly.model.state import RunState, RunStatus
from mayfly.reducer._apply import apply_event, new_state
from mayfly.reducer._fast import bind_fast_rules
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
    apply_event(state, event, sequence)
    return state


def replay(events: Iterable[Event], state: RunState | None = None) -> RunState:
    """Reduce ``events`` in order, numbering them after ``state``'s sequence (1 for a new run).

    Exactly :func:`reduce` on each event, but a hot event is applied by its
    fast rule (:mod:`mayfly.reducer._fast`), as the replay of stored records
    (:func:`reduce_encoded`) does; :func:`reduce`, the live path, takes the
    general rules, so a replay that equals the live state also shows that
    both sets of rules agree.
    """
    remaining = iter(events)
    if state is None:
        first = next(remaining, None)
        if first is None:
            raise CorruptionError("cannot replay an empty history")
        state = reduce(None, first, 1)
    sequence = state.sequence
    rules = bind_fast_rules(state)
    running = _RUN_RUNNING
    for event in remaining:
        sequence += 1
        rule = rules.get(type(event))
        if rule is None or state.status is not running:
            reduce(state, event, sequence)
        else:
            rule(event, sequence)
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

    The same as :func:`decode_event` then :func:`reduce` for each record, fused
    into one loop: a payload at its type's current version is decoded
    directly, and a hot event is applied by its fast rule
    (:mod:`mayfly.reducer._fast`), so a long replay does not pay several
    calls and type checks per event. A record whose sequence does not follow
    the previous one raises ``out_of_order(sequence, previous)``. Returns
    ``state`` unchanged (maybe ``None``) when there are no records.
    """
    remaining = iter(records)
    if state is None:
        first = next(remaining, None)
        if first is None:
            return None
        if first.sequence != 1:
            raise out_of_order(first.sequence, 0)
        state = reduce(None, _decode(first, upcasters), 1)
    after = state.sequence
    rules = bind_fast_rules(state)
    # Per event type: the version whose payloads decode directly, their decoder, and the fast rule.
    table = {
        name: (version, decode, rules.get(EVENT_TYPES[name]))
        for name, (version, decode) in current_decoders().items()
    }
    running = _RUN_RUNNING
    for record in remaining:
        sequence = record.sequence
        # A difference, not ``after + 1``: past 256 every sum would be a new int object.
        if sequence - after != 1:
            raise out_of_order(sequence, after)
        known = table.get(record.event_type)
        if known is not None:
            version, decode, rule = known
            if version == record.schema_version:
                try:
                    event = decode(record.payload)
                except _DECODE_ERRORS:
                    event = _decode(record, upcasters)  # only to raise the error decode_event gives
            else:
                event = _decode(record, upcasters)
                rule = None
        else:
            event = _decode(record, upcasters)
            rule = None
        if rule is None or state.status is not running:
            apply_event(state, event, sequence)
        else:
            rule(event, sequence)
        after = sequence
    return state


def _decode(record: EncodedRecord, upcasters: Mapping[tuple[str, int], Upcaster] | None) -> Event:
    return decode_event(record.event_type, record.schema_version, record.payload, upcasters=upcasters)
