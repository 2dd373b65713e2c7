"""Stored schedules in LMDB (feature ``schedule_store``): the named database ``schedules``.

Keys: ``d/NAME`` holds the definition (:func:`mayfly.schedules.encode_schedule`
bytes, checksummed, so damage fails closed on read), ``t/NAME`` the last tick
a worker recorded starting (8 bytes, big-endian). A put reads the stored
version and writes in one write transaction, so a conditional put is atomic
across threads and processes. An environment written before this database
existed, opened read-only, has no schedules.
"""

from __future__ import annotations

from typing import Final

import lmdb

from mayfly.backend import JournalBase
from mayfly.errors import CorruptionError, JournalUnavailable
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
from mayfly_lmdb._env import SharedEnv

__all__ = ["LmdbSchedules"]

_DEFINITION: Final = b"d/"
_TICK: Final = b"t/"


class LmdbSchedules(JournalBase):
    """The ``schedule_store`` methods of :class:`~mayfly_lmdb.LmdbJournal` (a base of it)."""

    @property
    def _env(self) -> SharedEnv:
        raise NotImplementedError

    def _writable(self, operation: str) -> SharedEnv:
        raise NotImplementedError

    def _stored(self, txn: lmdb.Transaction[bytes], shared: SharedEnv, name: str) -> StoredSchedule | None:
        if shared.schedules is None:
            return None
        key = name.encode("ascii")
        data = txn.get(_DEFINITION + key, db=shared.schedules)
        if data is None:
            return None
        tick = txn.get(_TICK + key, db=shared.schedules)
        if tick is not None and len(tick) != 8:
            raise CorruptionError(
                f"the last tick of schedule {name} in {shared.path} is damaged ({len(tick)} bytes, not 8); "
                "remove the schedule and add it again"
            )
        return decode_schedule(
            bytes(data),
            where=f"schedule {name} in lmdb environment {shared.path}",
            last_tick_ms=None if tick is None else int.from_bytes(tick, "big"),
        )

    def _schedules_db(self, shared: SharedEnv, operation: str) -> lmdb._Database:
        if shared.schedules is None:
            raise JournalUnavailable(f"{operation} refused: {shared.path} has no schedules database")
        return shared.schedules

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store the schedule under its name (create or replace; versioned) in one write transaction."""
        check_put(schedule, now_ms, expected_version)
        operation = f"storing schedule {schedule.name}"
        shared = self._writable(operation)
        self.ensure_open(operation)
        db = self._schedules_db(shared, operation)

        def body(txn: lmdb.Transaction[bytes]) -> StoredSchedule:
            stored = next_stored(
                self._stored(txn, shared, schedule.name),
                schedule,
                now_ms=now_ms,
                expected_version=expected_version,
            )
            txn.put(_DEFINITION + schedule.name.encode("ascii"), encode_schedule(stored), db=db)
            return stored

        return shared.write(body, operation)

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        check_schedule_name(name)
        self.ensure_open("schedules")
        shared = self._env
        return shared.read(lambda txn: self._stored(txn, shared, name), f"reading schedule {name}")

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        self.ensure_open("schedules")
        shared = self._env
        if shared.schedules is None:
            return []

        def body(txn: lmdb.Transaction[bytes]) -> list[StoredSchedule]:
            cursor = txn.cursor(db=shared.schedules)
            names: list[str] = []
            if cursor.set_range(_DEFINITION):
                for key in cursor.iternext(values=False):
                    if not key.startswith(_DEFINITION):
                        break
                    names.append(bytes(key[len(_DEFINITION) :]).decode("ascii", "replace"))
            found = [self._stored(txn, shared, name) for name in names]
            return [stored for stored in found if stored is not None]

        return shared.read(body, "listing schedules")

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick; ``False`` if there was none."""
        check_schedule_name(name)
        operation = f"removing schedule {name}"
        shared = self._writable(operation)
        self.ensure_open(operation)
        db = self._schedules_db(shared, operation)
        key = name.encode("ascii")

        def body(txn: lmdb.Transaction[bytes]) -> bool:
            txn.delete(_TICK + key, db=db)
            return bool(txn.delete(_DEFINITION + key, db=db))

        return shared.write(body, operation)

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record a started tick (the later one wins); ``False`` if no schedule has the name."""
        check_schedule_name(name)
        check_tick(tick_ms)
        operation = f"recording a tick of schedule {name}"
        shared = self._writable(operation)
        self.ensure_open(operation)
        db = self._schedules_db(shared, operation)
        key = name.encode("ascii")

        def body(txn: lmdb.Transaction[bytes]) -> bool:
            if txn.get(_DEFINITION + key, db=db) is None:
                return False
            last = txn.get(_TICK + key, db=db)
            if last is None or len(last) != 8 or int.from_bytes(last, "big") < tick_ms:
                txn.put(_TICK + key, tick_ms.to_bytes(8, "big"), db=db)
            return True

        return shared.write(body, operation)
