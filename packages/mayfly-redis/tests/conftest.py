"""Fixtures: a private AOF ``always`` redis-server per session, and CI's non-persistent Redis for memory mode.

A missing ``redis-server`` binary or an unreachable memory-mode server fails
the tests that need it; nothing here skips.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly_redis.testing import RedisClusterNodes, RedisServer, memory_url


@pytest.fixture(scope="session")
def aof_server() -> Iterator[RedisServer]:
    """A private redis-server with appendonly yes and appendfsync always, shared by the session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def aof_cluster() -> Iterator[RedisClusterNodes]:
    """A private three-primary Redis Cluster with AOF always, shared by the session."""
    with RedisClusterNodes() as cluster:
        yield cluster


@pytest.fixture
def fresh_server() -> Iterator[RedisServer]:
    """A private AOF always redis-server of this test alone (tests that kill or reconfigure it)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def memory_server_url() -> str:
    """The durability=memory URL of the non-persistent server (CI's default Redis on 6379)."""
    return memory_url()


class Records:
    """Sealed records with fresh UUIDv7 ids."""

    def __init__(self) -> None:
        self._ids = Uuid7IdSource()

    def new_id(self) -> str:
        """A fresh UUIDv7."""
        return self._ids.new_id()

    def batch(
        self, run_id: str, first: int, count: int = 1, payload: bytes = b'{"k":1}'
    ) -> list[JournalRecord]:
        """``count`` records of ``run_id`` from sequence ``first``."""
        return [
            JournalRecord.seal(
                run_id=run_id,
                sequence=sequence,
                event_id=self._ids.new_id(),
                event_type="Probe",
                schema_version=1,
                payload=payload,
            )
            for sequence in range(first, first + count)
        ]


@pytest.fixture
def records() -> Records:
    """A record factory."""
    return Records()


@pytest.fixture
def run_id(records: Records) -> str:
    """A fresh run id."""
    return records.new_id()
