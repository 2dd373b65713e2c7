"""Stored schedules on PostgreSQL (feature ``schedule_store``): the ``schedules`` table of migration 4.

One row per schedule: ``definition`` holds :func:`mayfly.schedules.encode_schedule`
bytes (checksummed, so damage fails closed on read), ``last_tick_ms`` the
latest tick a worker recorded starting, beside it so that recording a tick
never rewrites the definition. A put reads the stored version under the row's
lock (``FOR UPDATE``) and writes in the same transaction; two creates of one
name race on the primary key, and the loser reads again, so a conditional put
is atomic across every client.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from mayfly.backend import JournalBase
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
from mayfly_postgres._pool import HubConnection
from mayfly_postgres._store import Store

__all__ = ["PostgresSchedules", "ScheduleStatements"]


class ScheduleStatements:
    """The statements of the schedule store, on one schema."""

    def __init__(self, store: Store) -> None:
        table = store.table("schedules")
        self.get = sql.SQL("SELECT name, definition, last_tick_ms FROM {t} WHERE name = %s").format(t=table)
        self.lock = sql.SQL(
            "SELECT name, definition, last_tick_ms FROM {t} WHERE name = %s FOR UPDATE"
        ).format(t=table)
        self.list = sql.SQL(
            'SELECT name, definition, last_tick_ms FROM {t} ORDER BY name COLLATE "C"'
        ).format(t=table)
        self.insert = sql.SQL("INSERT INTO {t} (name, definition) VALUES (%s, %s)").format(t=table)
        self.update = sql.SQL("UPDATE {t} SET definition = %s WHERE name = %s").format(t=table)
        self.remove = sql.SQL("DELETE FROM {t} WHERE name = %s").format(t=table)
        self.mark = sql.SQL(
            "UPDATE {t} SET last_tick_ms = GREATEST(COALESCE(last_tick_ms, %(tick)s), %(tick)s) "
            "WHERE name = %(name)s"
        ).format(t=table)


class PostgresSchedules(JournalBase):
    """The ``schedule_store`` methods of :class:`~mayfly_postgres.PostgresJournal` (a base of it)."""

    _store: Store
    _schedule_sql: ScheduleStatements

    def _decode(self, row: tuple[Any, ...]) -> StoredSchedule:
        name, definition, last_tick = row
        where = f"schedule {name} in {self.url} (table {self._store.settings.schema}.schedules)"
        return decode_schedule(
            bytes(definition), where=where, last_tick_ms=None if last_tick is None else int(last_tick)
        )

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store the schedule under its name (create or replace; versioned) in one transaction."""
        check_put(schedule, now_ms, expected_version)
        self.ensure_open("schedules")
        statements = self._schedule_sql

        def put(connection: HubConnection) -> StoredSchedule | None:
            with connection.transaction():
                row = connection.execute(statements.lock, (schedule.name,)).fetchone()
                previous = None if row is None else self._decode(row)
                stored = next_stored(previous, schedule, now_ms=now_ms, expected_version=expected_version)
                data = encode_schedule(stored)
                if row is not None:
                    connection.execute(statements.update, (data, schedule.name))
                    return stored
                try:
                    with connection.transaction():
                        connection.execute(statements.insert, (schedule.name, data))
                except psycopg.errors.UniqueViolation:
                    return None  # created meanwhile by another client: read it again
                return stored

        while True:
            done = self._store.pool.retrying(f"storing schedule {schedule.name}", put)
            if done is not None:
                return done

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        check_schedule_name(name)
        self.ensure_open("schedules")

        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._schedule_sql.get, (name,)).fetchone()

        row = self._store.pool.retrying(f"reading schedule {name}", query)
        return None if row is None else self._decode(row)

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        self.ensure_open("schedules")

        def query(connection: HubConnection) -> list[tuple[Any, ...]]:
            return connection.execute(self._schedule_sql.list).fetchall()

        return [self._decode(row) for row in self._store.pool.retrying("listing schedules", query)]

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick; ``False`` if there was none."""
        check_schedule_name(name)
        self.ensure_open("schedules")

        def query(connection: HubConnection) -> int:
            return connection.execute(self._schedule_sql.remove, (name,)).rowcount

        return self._store.pool.retrying(f"removing schedule {name}", query) > 0

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record a started tick (the later one wins); ``False`` if no schedule has the name."""
        check_schedule_name(name)
        check_tick(tick_ms)
        self.ensure_open("schedules")

        def query(connection: HubConnection) -> int:
            return connection.execute(self._schedule_sql.mark, {"name": name, "tick": tick_ms}).rowcount

        return self._store.pool.retrying(f"recording a tick of schedule {name}", query) > 0
