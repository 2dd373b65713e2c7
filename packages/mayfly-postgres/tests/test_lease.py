"""PostgresLeaseStore beyond the contract suite: server-clock expiry, lost grant replies, takeover, close."""

from __future__ import annotations

import psycopg
import pytest
from pgserver import IDS, Proxy, batch, with_options

from mayfly.model.errors import FencingRejected, LeaseHeld, LeaseLost
from mayfly_postgres import PostgresJournal, PostgresLeaseStore


def _expire_on_server(server: str, schema: str, run: str) -> None:
    """Move the lease's expiry into the past on the server's clock (as if its ttl ran out there)."""
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(
            psycopg.sql.SQL(
                "UPDATE {} SET expires_at = clock_timestamp() - interval '1 second' WHERE run_id = %s"
            ).format(psycopg.sql.Identifier(schema, "leases")),
            (run,),
        )


def test_expiry_is_decided_by_the_server_clock(
    leases: PostgresLeaseStore, journal: PostgresJournal, server: str, schema: str
) -> None:
    """A day-long lease whose expiry passed on the server's clock is taken over; the old token is fenced."""
    run = IDS.new_id()
    old = leases.acquire(run, "host-a", 24 * 60 * 60 * 1000)
    with pytest.raises(LeaseHeld, match=r"host-a \(it expires in \d+\.\d s unless renewed\)") as held:
        leases.acquire(run, "host-b", 1000)
    assert (
        held.value.expires_in_ms is not None and 23 * 3_600_000 < held.value.expires_in_ms <= 24 * 3_600_000
    )
    _expire_on_server(server, schema, run)
    new = leases.acquire(run, "host-b", 60_000)
    assert new.fencing_token == old.fencing_token + 1 == leases.current_fence(run)
    with pytest.raises(LeaseLost):
        old.renew()
    with pytest.raises(FencingRejected):
        journal.append(run, 1, batch(run, 1), fence=old.fencing_token)
    journal.append(run, 1, batch(run, 1), fence=new.fencing_token)
    old.release()  # a taken-over lease is left to its new owner
    with pytest.raises(LeaseHeld, match="host-b"):
        leases.acquire(run, "host-c", 1000)
    new.release()


def test_renew_keeps_an_expired_lease_nobody_took(
    leases: PostgresLeaseStore, server: str, schema: str
) -> None:
    """A lease past its expiry but not taken over renews, and then refuses other acquirers again."""
    run = IDS.new_id()
    guard = leases.acquire(run, "slow", 60_000)
    _expire_on_server(server, schema, run)
    guard.renew(60_000)
    with pytest.raises(LeaseHeld):
        leases.acquire(run, "eager", 60_000)
    guard.release()


@pytest.mark.parametrize("mode", ["after", "before"])
def test_grant_whose_reply_is_lost_is_resolved_by_grant_id(
    server: str, schema: str, leases: PostgresLeaseStore, mode: str
) -> None:
    """A lost acquire reply is resolved by reading the grant id back: one grant, the token it recorded."""
    proxy = Proxy(server, "WITH granted AS", mode)
    try:
        with PostgresLeaseStore(with_options(proxy.url, schema=schema, pool_size=1)) as through_proxy:
            run = IDS.new_id()
            guard = through_proxy.acquire(run, "flaky-network", 60_000)
            assert proxy.dropped()
            assert guard.fencing_token == 1 == leases.current_fence(run)
            with pytest.raises(LeaseHeld, match="flaky-network"):
                leases.acquire(run, "other", 60_000)
            guard.release()
    finally:
        proxy.close()


def test_closing_the_store_releases_its_leases(url: str, leases: PostgresLeaseStore) -> None:
    """Closing a lease store releases the leases it still holds, so another owner can take them."""
    run = IDS.new_id()
    store = PostgresLeaseStore(url)
    store.acquire(run, "closing", 60_000)
    store.close()
    with leases.acquire(run, "next", 60_000) as guard:
        assert guard.fencing_token == 2


def test_released_guard_cannot_renew(leases: PostgresLeaseStore) -> None:
    """Renewing a released guard raises LeaseLost naming the run and token."""
    run = IDS.new_id()
    guard = leases.acquire(run, "done", 60_000)
    guard.release()
    with pytest.raises(LeaseLost, match=run):
        guard.renew()


def test_a_lease_released_between_the_refusal_and_the_holder_read_is_granted(
    leases: PostgresLeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder lets go just after a refused grant: the acquirer asks again and wins, never errs.

    A released lease stores ``-infinity`` as its expiry; reading its holder once
    failed with "cannot subtract infinite timestamps" (seen in CI, four racing
    recoverers). The interleaving is forced here: the refused grant's holder read
    runs after the holder's release, on the real server.
    """
    run = IDS.new_id()
    first = leases.acquire(run, "host-a", 60_000)
    holder = leases._holder
    calls = []

    def released_first(run_id: str) -> object:
        if not calls:
            first.release()
        calls.append(run_id)
        return holder(run_id)

    monkeypatch.setattr(leases, "_holder", released_first)
    second = leases.acquire(run, "host-b", 60_000)
    assert calls == [run]
    assert second.fencing_token == first.fencing_token + 1 == leases.current_fence(run)
    second.release()
    monkeypatch.undo()
    third = leases.acquire(run, "host-c", 60_000)
    assert leases._holder(run) is not None
    third.release()
    row = leases._holder(run)
    assert row is not None and row[3] is None  # a released lease reads as free, not as an error
