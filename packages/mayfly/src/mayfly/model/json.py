"""Canonical JSON: the one byte form that content hashes and checksums are computed over."""

from __future__ import annotations

import hashlib
import math
from typing import Any, TypeAlias

import msgspec

__all__ = ["JsonValue", "canonical_json", "check_finite", "content_hash", "sha256_hex"]

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
