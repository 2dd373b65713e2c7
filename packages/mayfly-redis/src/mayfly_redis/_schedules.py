"""Stored schedules on Redis (feature ``schedule_store``): two hashes under the prefix, in one slot.

``P:{schedules}:definitions`` maps each name to its definition
(:func:`mayfly.schedules.encode_schedule` bytes, checksummed, so damage fails
closed on read); ``P:{schedules}:ticks`` maps it to the last tick a worker
recorded starting. The hash tag keeps both in one slot, so on a Cluster the
scripts below touch one node. A put is a compare-and-set: the definition read, the new
one computed, and a script that writes it only if the stored bytes are still
the ones read (else the put reads again), so a conditional put is atomic
across every client. Removing and marking are one script each.

A Cluster store written before run-index sharding declares no
``schedule_store``: it keeps no run index, so no worker could serve the
schedules there (see the journal's capabilities).
"""

from __future__ import annotations

from typing import Any, Final

from mayfly.backend import JournalBase
from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.schedules import (
    Schedule,
    StoredSchedule,
    check_put,
    check_schedule_name,
    check_tick,
    decode_schedule,
    encode_schedule,
    next_stored,
)
from mayfly_redis._client import RedisStore
from mayfly_redis._url import RedisTarget

__all__ = ["RedisSchedules"]

# KEYS: definitions, ticks. ARGV: name, the bytes read ("" when absent), the bytes to store.
_PUT: Final = """
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if (stored or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
# KEYS: definitions, ticks. ARGV: name.
_REMOVE: Final = """
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
"""
# KEYS: definitions, ticks. ARGV: name, tick (a decimal integer below 2^53: exact as a Lua number).
_MARK: Final = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '')
if last == nil or last < tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(reply: Any) -> dict[str, Any]:
    """An ``HGETALL`` reply by field: a flat list on a standalone server, a dict from a Cluster client."""
    if isinstance(reply, dict):
        return {_text(name): value for name, value in reply.items()}
    return {_text(name): value for name, value in zip(reply[0::2], reply[1::2], strict=True)}


class RedisSchedules(JournalBase):
    """The ``schedule_store`` methods of :class:`~mayfly_redis.RedisJournal` (a base of it)."""

    _store: RedisStore
    _target: RedisTarget

    def _schedule_keys(self) -> list[str]:
        prefix = self._target.prefix
        return [f"{prefix}:{{schedules}}:definitions", f"{prefix}:{{schedules}}:ticks"]

    def _schedules_served(self, operation: str) -> RedisStore:
        self.ensure_open(operation)
        if not self._capabilities.schedule_store:
            raise CompatibilityError(
                f"{operation}: this Redis Cluster store (prefix {self._target.prefix!r}) was written before "
                "run-index sharding and keeps no run index, so no worker could serve its schedules; "
                "use a new prefix"
            )
        return self._store

    def _decode(self, name: str, definition: bytes, tick: Any) -> StoredSchedule:
        definitions, ticks = self._schedule_keys()
        where = f"schedule {name} in {definitions}"
        last: int | None = None
        if tick is not None:
            try:
                last = check_tick(int(_text(tick)))
            except ValueError:
                raise CorruptionError(
                    f"the last tick of schedule {name} in {ticks} is unreadable ({tick!r:.40}); "
                    "delete that field (it is advisory)"
                ) from None
        return decode_schedule(bytes(definition), where=where, last_tick_ms=last)

    def _read_schedule(self, store: RedisStore, name: str) -> tuple[StoredSchedule | None, bytes]:
        definitions, ticks = self._schedule_keys()
        definition = store.raw_call(f"read schedule {name}", "HGET", definitions, name)
        if definition is None:
            return None, b""
        tick = store.raw_call(f"read the last tick of schedule {name}", "HGET", ticks, name)
        return self._decode(name, definition, tick), bytes(definition)

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store the schedule under its name (create or replace; versioned): compare-and-set."""
        check_put(schedule, now_ms, expected_version)
        store = self._schedules_served("schedules")
        while True:
            previous, read = self._read_schedule(store, schedule.name)
            stored = next_stored(previous, schedule, now_ms=now_ms, expected_version=expected_version)
            written = store.script(
                f"store schedule {schedule.name}",
                _PUT,
                self._schedule_keys(),
                [schedule.name, read, encode_schedule(stored)],
            )
            if int(written):
                return stored

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        check_schedule_name(name)
        return self._read_schedule(self._schedules_served("schedules"), name)[0]

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        store = self._schedules_served("schedules")
        definitions, ticks = self._schedule_keys()
        stored = _fields(store.raw_call("list schedules", "HGETALL", definitions))
        last = _fields(store.raw_call("list schedule ticks", "HGETALL", ticks))
        return [self._decode(name, stored[name], last.get(name)) for name in sorted(stored)]

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick; ``False`` if there was none."""
        check_schedule_name(name)
        store = self._schedules_served("schedules")
        return bool(int(store.script(f"remove schedule {name}", _REMOVE, self._schedule_keys(), [name])))

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record a started tick (the later one wins); ``False`` if no schedule has the name."""
        check_schedule_name(name)
        check_tick(tick_ms)
        store = self._schedules_served("schedules")
        marked = store.script(
            f"record a tick of schedule {name}", _MARK, self._schedule_keys(), [name, tick_ms]
        )
        return bool(int(marked))
