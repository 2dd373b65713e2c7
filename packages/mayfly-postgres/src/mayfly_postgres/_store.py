"""One opened database per URL in a process: the pool, the durability check and the current schema.

A journal and a lease store opened on the same URL share one :class:`Store`
(and so one pool), counted by references and closed with the last user.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from psycopg import sql

from mayfly.errors import DurabilityUnavailable
from mayfly.journal import Durability
from mayfly_postgres._pool import ConnectionPool, HubConnection
from mayfly_postgres._schema import ensure_schema
from mayfly_postgres._url import PostgresSettings, parse_url

__all__ = ["Store", "open_store", "rendered"]

_STORES: dict[tuple[object, ...], Store] = {}
_STORES_LOCK: Final = threading.Lock()


def rendered(statement: sql.Composable) -> bytes:
    """A statement's text, rendered once (psycopg renders a composed statement again on every execute).

    Identifiers and literals are quoted as for a UTF-8 server with standard
    conforming strings, which a schema name and a channel name (lowercase
    ASCII) never tell apart.
    """
    return statement.as_bytes(None)


class Store:
    """A pool on one schema, checked for durability and migrated when it was opened."""

    def __init__(self, settings: PostgresSettings, key: tuple[object, ...]) -> None:
        self.settings = settings
        self.pool = ConnectionPool(settings)
        self._key = key
        self._users = 0
        try:
            self.pool.retrying("opening the journal", self._prepare)
        except BaseException:
            self.pool.close()
            raise

    def table(self, name: str) -> sql.Identifier:
        """The schema-qualified, quoted name of one of Mayfly's tables."""
        return sql.Identifier(self.settings.schema, name)

    def _prepare(self, connection: HubConnection) -> None:
        settings = self.settings
        fsync, synchronous = (
            str(connection.execute("SHOW fsync").fetchone()[0]),  # type: ignore[index]
            str(connection.execute("SHOW synchronous_commit").fetchone()[0]),  # type: ignore[index]
        )
        if settings.durability is Durability.DURABLE and (fsync != "on" or synchronous != "on"):
            raise DurabilityUnavailable(
                f"{settings.url}: durability=durable needs fsync=on and synchronous_commit=on, the server "
                f"runs with fsync={fsync}, synchronous_commit={synchronous}; fix the server settings "
                "or open with ?durability=write to accept losing acknowledged appends on a server crash"
            )
        ensure_schema(connection, settings)

    def acquire_user(self) -> None:
        """Count one more journal or lease store using this store."""
        self._users += 1

    def share(self) -> Store:
        """Count one more user (a lease store a journal opens on its own store) and return the store."""
        with _STORES_LOCK:
            self._users += 1
        return self

    def release_user(self) -> None:
        """Count one user less; the last one closes the pool."""
        with _STORES_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if _STORES.get(self._key) is self:
                del _STORES[self._key]
        self.pool.close()


def open_store(url: str) -> Store:
    """Return the process's store for ``url``, opening (and migrating) it on first use."""
    settings = parse_url(url)
    key = (
        os.getpid(),  # a forked child must never reuse its parent's sockets
        settings.conninfo,
        settings.schema,
        settings.durability,
        settings.migrate,
        settings.pool_size,
        settings.reconnect_timeout,
    )
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is not None:
            store.acquire_user()
            return store
    # Opened outside the lock: connecting may park this hub task, and no lock is held across a switch.
    fresh = Store(settings, key)
    with _STORES_LOCK:
        store = _STORES.setdefault(key, fresh)
        store.acquire_user()
    if store is not fresh:
        fresh.pool.close()
    return store
