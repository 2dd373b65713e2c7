"""Canonical JSON: the one byte form that content hashes and checksums are computed over."""

from __future__ import annotations

import hashlib
import math
from typing import Any, TypeAlias

import msgspec

from mayfly.model.errors import InvalidJSONValue, LimitExceeded
from mayfly.model.limits import MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS

__all__ = [
    "JsonValue",
    "canonical_json",
    "check_finite",
    "check_json_value",
    "content_hash",
    "sha256_hex",
]

JsonValue: TypeAlias = Any
"""A JSON value (object, array, string, number, boolean or null) held as Python builtins."""

_ENCODER = msgspec.json.Encoder(order="sorted")


def canonical_json(value: object) -> bytes:
    """Encode ``value`` as compact JSON with object keys and struct fields sorted.

    Sorting makes the bytes independent of dict insertion order and field
    declaration order, so a hash over them is stable across runs and machines.
    """
    return _ENCODER.encode(value)


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def content_hash(value: object) -> str:
    """``sha256:``-prefixed SHA-256 of the canonical JSON of ``value``."""
    return "sha256:" + sha256_hex(canonical_json(value))


def check_finite(value: object, what: str) -> None:
    """Raise ValueError if ``value`` holds NaN or an infinity anywhere.

    JSON has no such numbers: msgspec would write them as ``null``, so the
    live run would hold NaN while every replay of its history held ``null``.
    Refusing them keeps replay equal to live.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{what} is not JSON: it contains the non-finite number {item!r}")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


_INT_BOUND = 10**MAX_JSON_INT_DIGITS


def check_json_value(value: object, what: str) -> None:
    """Raise if ``value`` could be stored as JSON but not read back as the same value.

    Refuses NaN and infinities (msgspec writes them as ``null``), object keys
    that are not strings (they would read back as strings) and integers of
    more than :data:`~mayfly.model.limits.MAX_JSON_INT_DIGITS` digits (msgspec
    cannot decode them) with :class:`InvalidJSONValue`, and nesting
    deeper than :data:`~mayfly.model.limits.MAX_JSON_DEPTH` with
    :class:`LimitExceeded`. Types that have no JSON form are left to the
    encoder. The walk is iterative, level by level, so no depth can exhaust
    the stack here.
    """
    level: list[object] = [value]
    depth = 0
    while level:
        below: list[object] = []
        opened = False
        for item in level:
            if isinstance(item, str) or item is None:
                continue
            if isinstance(item, float):
                if not math.isfinite(item):
                    raise InvalidJSONValue(f"{what} is not JSON: it contains the non-finite number {item!r}")
            elif isinstance(item, int):
                if not -_INT_BOUND < item < _INT_BOUND:
                    raise InvalidJSONValue(
                        f"{what} holds an integer of more than {MAX_JSON_INT_DIGITS} digits, "
                        "which JSON decoders refuse; pass it as a string"
                    )
            elif isinstance(item, dict):
                opened = True
                for key in item:
                    if not isinstance(key, str):
                        raise InvalidJSONValue(
                            f"{what} is not JSON: it has the object key {key!r}, and JSON keys are strings"
                        )
                below.extend(item.values())
            elif isinstance(item, list | tuple | set | frozenset):
                opened = True
                below.extend(item)
        depth += opened
        level = below
    if depth > MAX_JSON_DEPTH:
        raise LimitExceeded(f"{what} nesting", MAX_JSON_DEPTH, depth, "levels")
