"""Fixtures: a real PostgreSQL (shared server or private cluster) and a fresh schema per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pgserver import PrivateCluster, binaries, drop_schema, fresh_schema, reachable, server_url, with_options

from mayfly_postgres import PostgresJournal, PostgresLeaseStore


def _in_ci() -> bool:
    return bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """The URL of a reachable PostgreSQL: the configured one, else a private cluster."""
    url = server_url()
    problem = reachable(url)
    if problem is None:
        yield url
        return
    if _in_ci() or binaries() is None:
        pytest.fail(
            f"PostgreSQL at {url} is unreachable ({problem}) and no private cluster can be started "
            "here; set MAYFLY_TEST_POSTGRES_URL or install initdb/pg_ctl",
            pytrace=False,
        )
    cluster = PrivateCluster()
    try:
        yield cluster.url
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def cluster_binaries() -> None:
    """Require initdb/pg_ctl: a failure in CI, a skip naming them elsewhere."""
    if binaries() is None:
        if _in_ci():
            pytest.fail("initdb/pg_ctl are not installed; these tests need their own cluster", pytrace=False)
        pytest.skip("initdb/pg_ctl are not installed: tests that restart or reconfigure PostgreSQL need them")


@pytest.fixture(scope="session")
def private_cluster(cluster_binaries: None) -> Iterator[PrivateCluster]:
    """A PostgreSQL cluster this session started itself, so tests may crash and restart it."""
    cluster = PrivateCluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def schema(server: str) -> Iterator[str]:
    """A schema of its own for this test session, dropped at the end."""
    name = fresh_schema()
    yield name
    drop_schema(server, name)


@pytest.fixture(scope="session")
def url(server: str, schema: str) -> str:
    """The backend URL of this session's schema."""
    return with_options(server, schema=schema)


@pytest.fixture
def journal(url: str) -> Iterator[PostgresJournal]:
    """A journal on the session's schema."""
    with PostgresJournal(url) as opened:
        yield opened


@pytest.fixture
def leases(url: str) -> Iterator[PostgresLeaseStore]:
    """A lease store on the session's schema."""
    with PostgresLeaseStore(url) as opened:
        yield opened
