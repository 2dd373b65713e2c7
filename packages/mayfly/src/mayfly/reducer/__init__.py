"""The pure reducer: specification validation, ``decide`` and ``reduce``.

Nothing here performs I/O, reads a clock, the environment or randomness, or
touches a greenlet; the same inputs always give the same outputs.
"""

from mayfly.reducer.backoff import backoff_delay, fnv1a_64, jitter, retry_delay
from mayfly.reducer.codec import EncodedEvent, Upcaster, decode_event, encode_event
from mayfly.reducer.decide import Decision, decide
from mayfly.reducer.reduce import EncodedRecord, reduce, reduce_encoded, replay
from mayfly.reducer.validate import check_input, ensure_valid, validate

__all__ = [
    "Decision",
    "EncodedEvent",
    "EncodedRecord",
    "Upcaster",
    "backoff_delay",
    "check_input",
    "decide",
    "decode_event",
    "encode_event",
    "ensure_valid",
    "fnv1a_64",
    "jitter",
    "reduce",
    "reduce_encoded",
    "replay",
    "retry_delay",
    "validate",
]
