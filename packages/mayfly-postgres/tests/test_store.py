"""Opening a store: durability refused on a server that cannot honour it, one pool per URL and process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pgserver import IDS, PrivateCluster, batch, with_options

from mayfly.journal import Durability
from mayfly.model.errors import DurabilityUnavailable
from mayfly_postgres import PostgresJournal, PostgresLeaseStore


@pytest.fixture(scope="module")
def unsafe_cluster(cluster_binaries: None) -> Iterator[PrivateCluster]:
    """A private cluster running with fsync=off (a server that cannot make commits durable)."""
    cluster = PrivateCluster("fsync=off")
    try:
        yield cluster
    finally:
        cluster.destroy()


def test_durable_is_refused_when_the_server_runs_without_fsync(unsafe_cluster: PrivateCluster) -> None:
    """durability=durable on a server with fsync=off raises DurabilityUnavailable when opening."""
    with pytest.raises(DurabilityUnavailable, match="fsync=off"):
        PostgresJournal(with_options(unsafe_cluster.url, schema="mayfly"))


def test_write_durability_is_accepted_on_that_server(unsafe_cluster: PrivateCluster) -> None:
    """durability=write claims less and opens on the same server."""
    with PostgresJournal(with_options(unsafe_cluster.url, schema="mayfly", durability="write")) as journal:
        assert journal.durability is Durability.WRITE
        run = IDS.new_id()
        journal.append(run, 1, batch(run, 1))


def test_journal_and_leases_on_one_url_share_a_pool(url: str) -> None:
    """A journal and a lease store opened on the same URL share one pool, closed with its last user."""
    journal = PostgresJournal(url)
    leases = PostgresLeaseStore(url)
    pool = journal._store.pool
    assert leases._store.pool is pool
    journal.close()
    with leases.acquire(IDS.new_id(), "still-open", 1000):
        pass
    leases.close()
    with PostgresJournal(url) as reopened:
        assert reopened._store.pool is not pool
