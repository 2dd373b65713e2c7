"""The event codec: events written at the current schema version, read back through upcasters.

Events are written at the schema version this code knows
(:data:`~mayfly.model.events.EVENT_SCHEMA_VERSIONS`) and read back through
registered upcasters from older versions. An unknown event type or version is a
:class:`CompatibilityError`; it is never skipped. A payload that does not decode
as its type is a :class:`CorruptionError`; no other error escapes, whatever
the bytes (an upcaster's own errors aside).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import msgspec

from mayfly.model.errors import CompatibilityError, CorruptionError, one_line
from mayfly.model.events import EVENT_SCHEMA_VERSIONS, EVENT_TYPES, Event

__all__ = ["EncodedEvent", "Upcaster", "current_decoders", "decode_event", "encode_event"]

Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
"""Lifts one event payload (decoded to a dict) from version N to version N + 1."""

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(cls) for name, cls in EVENT_TYPES.items()
}


class EncodedEvent(msgspec.Struct, frozen=True):
    """An event's envelope fields and payload bytes, ready for a journal record."""

    event_type: str
    schema_version: int
    payload: bytes


def encode_event(event: Event) -> EncodedEvent:
    """Encode ``event`` as compact JSON at the schema version this code writes."""
    name = type(event).__name__
    return EncodedEvent(name, EVENT_SCHEMA_VERSIONS[name], _ENCODER.encode(event))


def current_decoders() -> dict[str, tuple[int, Callable[[bytes], Event]]]:
    """Each event type's current schema version and the bare decode of a payload written at it.

    For loops that decode many records: a payload at that version needs no
    upcasting, and one that fails to decode must be decoded again through
    :func:`decode_event`, which raises the error it deserves.
    """
    return {name: (EVENT_SCHEMA_VERSIONS[name], _DECODERS[name].decode) for name in _DECODERS}


def decode_event(
    event_type: str,
    schema_version: int,
    payload: bytes,
    *,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> Event:
    """Decode one event payload, upcasting older versions; unknown types or versions fail closed."""
    current = EVENT_SCHEMA_VERSIONS.get(event_type)
    if current is None:
        raise CompatibilityError(
            f"unknown event type {event_type!r} (version {schema_version}); "
            "this history was written by a newer or different Mayfly — upgrade before reading it"
        )
    try:
        if schema_version == current:
            event: Event = _DECODERS[event_type].decode(payload)
            return event
        if schema_version > current or schema_version < 1:
            raise CompatibilityError(
                f"unknown {event_type} schema version {schema_version} "
                f"(this Mayfly reads up to {current}); upgrade Mayfly to read this history"
            )
        body = msgspec.json.decode(payload)
        if not isinstance(body, dict):
            raise CorruptionError(f"{event_type} v{schema_version} payload is not a JSON object")
        for version in range(schema_version, current):
            upcast = (upcasters or {}).get((event_type, version))
            if upcast is None:
                raise CompatibilityError(
                    f"no upcaster registered for {event_type} v{version} -> v{version + 1}"
                )
            body = upcast(body)
        converted: Event = msgspec.convert(body, EVENT_TYPES[event_type])
        return converted
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise CorruptionError(
            f"{event_type} v{schema_version} payload is invalid: {one_line(str(exc))}"
        ) from None
    except RecursionError:
        # Nothing Mayfly writes nests this deep (inputs and decisions are bounded well below).
        raise CorruptionError(
            f"{event_type} v{schema_version} payload is invalid: nested too deeply to decode"
        ) from None
