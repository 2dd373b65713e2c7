"""Tests of the UUIDv7 id source."""

from __future__ import annotations

import uuid

from mayfly.identity import Uuid7IdSource
from mayfly.model.ids import is_uuid


def test_ids_are_canonical_version_7_rfc_variant() -> None:
    """Every id is canonical lowercase, version 7 and of the RFC 9562 variant."""
    source = Uuid7IdSource()
    for _ in range(1000):
        text = source.new_id()
        assert is_uuid(text)
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_timestamp_is_unix_milliseconds() -> None:
    """The top 48 bits carry the clock's Unix milliseconds."""
    source = Uuid7IdSource(clock_ms=lambda: 0x0193_0000_1234)
    assert source.new_id().startswith("01930000-1234-7")


def test_ids_increase_within_a_process() -> None:
    """Ids from one source are strictly increasing, so they sort by creation."""
    source = Uuid7IdSource()
    ids = [source.new_id() for _ in range(20_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ids_are_unique_over_100k() -> None:
    """A hundred thousand ids are all distinct."""
    source = Uuid7IdSource()
    assert len({source.new_id() for _ in range(100_000)}) == 100_000


def test_stalled_clock_uses_counter_then_borrows_next_millisecond() -> None:
    """With a frozen clock the counter keeps ids increasing, past its 12-bit range."""
    source = Uuid7IdSource(clock_ms=lambda: 1000)
    ids = [source.new_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert uuid.UUID(ids[-1]).int >> 80 > 1000


def test_clock_stepping_back_keeps_order() -> None:
    """A clock that steps backwards does not make ids go backwards."""
    times = iter([5000, 4000, 3000])
    source = Uuid7IdSource(clock_ms=lambda: next(times))
    first, second, third = source.new_id(), source.new_id(), source.new_id()
    assert first < second < third


def test_each_field_is_the_rfc_9562_layout_of_the_clock_counter_and_random_bytes() -> None:
    """Built from the clock, the counter and the random bytes exactly as RFC 9562 §5.7 lays them out.

    The id is formatted digit by digit for speed; here it is checked against
    the 128-bit integer the RFC describes, over random bytes that set every
    bit of rand_b (the variant bits overwrite the top two).
    """
    clock = iter([0x0193_0000_1234] * 3 + [0x0193_0000_1235] * 2 + [0xFFFF_FFFF_FFFF])
    stream = bytes(range(256)) * 4 + b"\xff" * 64 + b"\x00" * 64
    drawn = 0

    def random_bytes(count: int) -> bytes:
        nonlocal drawn
        chunk = stream[drawn : drawn + count]
        drawn += count
        return chunk

    source = Uuid7IdSource(clock_ms=lambda: next(clock), random_bytes=random_bytes)
    at = 0
    counter = -1
    last_ms = -1
    for _ in range(6):
        text = source.new_id()
        ms = uuid.UUID(text).int >> 80
        if ms != last_ms:  # a new millisecond draws two bytes of counter seed first
            counter = int.from_bytes(stream[at : at + 2], "big") & ((1 << 11) - 1)
            at += 2
            last_ms = ms
        else:
            counter += 1
        rand_b = int.from_bytes(stream[at : at + 8], "big") & ((1 << 62) - 1)
        at += 8
        expected = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
        assert text == str(uuid.UUID(int=expected))
    assert last_ms == 0xFFFF_FFFF_FFFF
