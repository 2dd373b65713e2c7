"""``PostgresLeaseStore``: expiring recovery leases on the server's clock, fenced in the runs table.

Every lease operation is one statement. ``acquire`` upserts the run's
``leases`` row only when there is none or the current one has expired by the
server's ``clock_timestamp()`` (the check runs on the newest row version,
under its row lock, so two acquirers never both win), increments the token
stored in that row, and copies it into ``runs.fence`` in the same statement:
from the moment the grant commits, the journal rejects appends made with any
older token. A grant carries a random ``grant_id``; if the reply is lost the
store reads the row back to learn whether the grant is ours.

The live leases are listed (``lease_listing``) by one plain ``SELECT``: it
takes no row lock, so it never waits for a grant and no grant waits for it.
It finds the live rows through ``leases_expiry`` (released rows sit at
``-infinity``, expired ones before the statement's time), so the rows of
runs leased long ago cost nothing, and pages them in run id order.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final, final

import psycopg
from psycopg import sql

from mayfly.backend import LeaseGuardBase, LeaseStoreBase
from mayfly.errors import LeaseHeld
from mayfly.lease import LeaseCapabilities, LeaseInfo
from mayfly_postgres._pool import HubConnection, is_transient, pause, unavailable
from mayfly_postgres._store import Store, open_store, rendered

__all__ = ["PostgresLeaseGuard", "PostgresLeaseStore"]

_RETRY_CEILING_S: Final = 1.0
_FREED_RETRIES: Final = 3  # grant attempts when the lease turns out free right after a refusal


class _Statements:
    """The lease SQL, composed once per schema."""

    def __init__(self, store: Store) -> None:
        leases, runs = store.table("leases"), store.table("runs")
        self.acquire = rendered(
            sql.SQL(
                "WITH granted AS (INSERT INTO {leases} AS l (run_id, owner, token, grant_id, expires_at) "
                "VALUES (%(run)s::uuid, %(owner)s, 1, %(grant)s::uuid, "
                "clock_timestamp() + %(ttl)s::float8 * interval '1 millisecond') "
                "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1, "
                "grant_id = EXCLUDED.grant_id, expires_at = EXCLUDED.expires_at "
                "WHERE l.expires_at <= clock_timestamp() RETURNING l.run_id, l.token), "
                "fenced AS (INSERT INTO {runs} AS r (run_id, fence) SELECT run_id, token FROM granted "
                "ON CONFLICT (run_id) DO UPDATE SET fence = GREATEST(r.fence, EXCLUDED.fence) RETURNING 1) "
                "SELECT token FROM granted"
            ).format(leases=leases, runs=runs)
        )
        self.holder = sql.SQL(
            "SELECT owner, token, grant_id::text, "
            "CASE WHEN expires_at > clock_timestamp() "
            "THEN floor(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint END "
            "FROM {leases} WHERE run_id = %s::uuid"
        ).format(leases=leases)
        self.renew = rendered(
            sql.SQL(
                "UPDATE {leases} SET expires_at = clock_timestamp() + %s::float8 * interval '1 millisecond' "
                "WHERE run_id = %s::uuid AND grant_id = %s::uuid AND expires_at > '-infinity' RETURNING 1"
            ).format(leases=leases)
        )
        self.release = rendered(
            sql.SQL(
                "UPDATE {leases} SET expires_at = '-infinity' WHERE run_id = %s::uuid AND grant_id = %s::uuid"
            ).format(leases=leases)
        )
        self.current_fence = sql.SQL("SELECT fence FROM {runs} WHERE run_id = %s::uuid").format(runs=runs)
        # statement_timestamp() is stable, so it bounds the leases_expiry range (clock_timestamp() could not).
        # Ordered by the uuid column itself (l.run_id), never by its text under a collation.
        listing = (
            "SELECT l.run_id::text AS run, l.owner, l.token, "
            "floor(extract(epoch FROM l.expires_at) * 1000)::bigint, "
            "floor(extract(epoch FROM l.expires_at - statement_timestamp()) * 1000)::bigint "
            "FROM {leases} AS l WHERE l.expires_at > statement_timestamp() {after} "
            "ORDER BY l.run_id LIMIT %(limit)s"
        )
        self.list_first = sql.SQL(listing).format(leases=leases, after=sql.SQL(""))
        after = sql.SQL("AND l.run_id > %(after)s::uuid")
        self.list_after = sql.SQL(listing).format(leases=leases, after=after)


@final
class PostgresLeaseGuard(LeaseGuardBase[str]):
    """A granted lease: valid until released, or expired (server clock) and taken over.

    Its grant is the random ``grant_id`` stored with it: renew and release
    match on it, so a guard never touches a later grant.
    """

    _store: PostgresLeaseStore

    def _renew(self, ttl_ms: int) -> None:
        """Extend the lease to ``ttl_ms`` from now on the server's clock; ``LeaseLost`` if taken over."""
        statements = self._store._sql

        def query(connection: HubConnection) -> bool:
            row = connection.execute(statements.renew, (ttl_ms, self.run_id, self._grant)).fetchone()
            return row is not None

        if not self._store._store.pool.retrying(f"renewing the lease of run {self.run_id}", query):
            raise self.lost("was taken over after it expired")

    def _release(self) -> None:
        statements = self._store._sql

        def query(connection: HubConnection) -> None:
            connection.execute(statements.release, (self.run_id, self._grant))

        self._store._store.pool.retrying(f"releasing the lease of run {self.run_id}", query)


@final
class PostgresLeaseStore(LeaseStoreBase[PostgresLeaseGuard]):
    """A ``RecoveryLeaseStore`` on PostgreSQL: non-blocking, exclusive across hosts, fenced."""

    def __init__(self, url: str | Store) -> None:
        # A Store: the lease store a journal's claims hand guards out of, on the journal's own pool.
        self._store = url.share() if isinstance(url, Store) else open_store(url)
        self._sql = _Statements(self._store)
        listing = LeaseCapabilities.declare("lease_listing")
        super().__init__(url=self._store.settings.url, capabilities=listing)

    def adopt(self, run_id: str, owner: str, *, token: int, ttl_ms: int, grant: str) -> PostgresLeaseGuard:
        """The guard of a lease granted elsewhere (a run-index claim), held by this store like its own."""
        guard = PostgresLeaseGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=grant)
        with self._held_lock:
            self._held.add(guard)
        return guard

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> PostgresLeaseGuard:
        """Grant the run's lease now with the next fencing token, or raise ``LeaseHeld``; never waits."""
        run = run_id
        for _ in range(_FREED_RETRIES):
            grant = str(uuid.uuid4())
            row = self._try_acquire(run, owner, ttl_ms, grant)
            if row is not None:
                return PostgresLeaseGuard(self, run, owner, token=int(row[0]), ttl_ms=ttl_ms, grant=grant)
            holder = self._holder(run)
            if holder is not None and holder[3] is not None:
                raise LeaseHeld(run, str(holder[0]), expires_in_ms=int(holder[3]))
            # The holder released the lease (or it expired) between the grant and this read: ask again.
        raise LeaseHeld(run)

    def _try_acquire(self, run: str, owner: str, ttl_ms: int, grant: str) -> tuple[Any, ...] | None:
        """One grant attempt, retried over transient failures: the token row, or ``None`` if refused."""
        arguments = {"run": run, "owner": owner, "grant": grant, "ttl": ttl_ms}
        settings = self._store.settings
        deadline = time.monotonic() + settings.reconnect_timeout
        delay = 0.05
        while True:
            try:
                with self._store.pool.connection() as connection:
                    row = connection.execute(self._sql.acquire, arguments).fetchone()
                break
            except psycopg.Error as error:
                if not is_transient(error):
                    raise unavailable(self.url, f"acquiring the lease of run {run}", error) from None
                holder = self._holder(run)  # the grant may have committed before the reply was lost
                if holder is not None and holder[2] == grant:
                    row = (holder[1],)
                    break
                if time.monotonic() + delay > deadline:
                    raise unavailable(self.url, f"acquiring the lease of run {run}", error) from None
                pause(delay)
                delay = min(delay * 2, _RETRY_CEILING_S)
        return row

    def _holder(self, run: str) -> tuple[Any, ...] | None:
        def query(connection: HubConnection) -> tuple[Any, ...] | None:
            return connection.execute(self._sql.holder, (run,)).fetchone()

        return self._store.pool.retrying(f"reading the lease of run {run}", query)

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        statement = self._sql.list_first if after is None else self._sql.list_after

        def query(connection: HubConnection) -> list[tuple[Any, ...]]:
            return connection.execute(statement, {"after": after, "limit": limit}).fetchall()

        rows = self._store.pool.retrying("listing leases", query)
        return [
            LeaseInfo(
                run_id=run,
                owner=owner,
                fencing_token=int(token),
                expires_at_ms=int(expires_at),
                expires_in_ms=int(expires_in),
            )
            for run, owner, token, expires_at, expires_in in rows
        ]

    def _current_fence(self, run_id: str) -> int:
        def query(connection: HubConnection) -> int:
            row = connection.execute(self._sql.current_fence, (run_id,)).fetchone()
            return 0 if row is None else int(row[0])

        return self._store.pool.retrying(f"reading the fence of run {run_id}", query)

    def _close(self) -> None:
        """Release the store's hold on the connection pool."""
        self._store.release_user()
