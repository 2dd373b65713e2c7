"""The plugin: entry point, schemes, descriptions for ``mayfly backends``, opening by URL."""

from __future__ import annotations

from mayfly.plugins import list_backends, open_journal, open_leases
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis._plugin import describe
from mayfly_redis.testing import RedisServer


def test_schemes_are_listed_with_the_distribution() -> None:
    """redis and rediss journals and leases are installed, served by mayfly-redis."""
    rows = {(row.kind, row.scheme): row for row in list_backends() if row.scheme.startswith("redis")}
    assert set(rows) == {(kind, scheme) for kind in ("journal", "lease") for scheme in ("redis", "rediss")}
    assert {row.distribution for row in rows.values()} == {"mayfly-redis"}


def test_backends_report_the_durability_of_a_url() -> None:
    """`mayfly backends` with a URL says whether it is durable or memory-only, without connecting."""
    memory = [
        row for row in list_backends("redis://10.255.255.1:1/0?durability=memory") if row.scheme == "redis"
    ]
    assert all("NOT durable" in row.description for row in memory)
    durable = describe("redis://10.255.255.1:1/0")
    assert "durability aof: durable" in durable
    assert "TLS" in describe("rediss://h/0")


def test_open_by_url(aof_server: RedisServer) -> None:
    """open_journal and open_leases resolve redis:// to this distribution's classes."""
    with open_journal(aof_server.url) as journal, open_leases(aof_server.url) as leases:
        assert isinstance(journal, RedisJournal)
        assert isinstance(leases, RedisLeaseStore)
        assert journal.url == leases.url == aof_server.url
