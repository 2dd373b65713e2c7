"""Test tooling: find the PostgreSQL server, or start a private cluster with initdb/pg_ctl.

The server is ``MAYFLY_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). When it is unreachable and
``initdb``/``pg_ctl`` exist, a private cluster is started in a temporary
directory (as the ``postgres`` user when the tests run as root, because initdb
refuses root). In CI (``CI`` set) an unreachable server is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly_contract.sim._servers import PrivateCluster, binaries  # the cluster lives in the contract kit

__all__ = ["PrivateCluster", "binaries"]

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def server_url() -> str:
    """The configured shared server URL (without Mayfly options)."""
    return os.environ.get("MAYFLY_TEST_POSTGRES_URL", DEFAULT_URL)


def reachable(url: str) -> str | None:
    """Return None if ``url`` accepts a connection, else the reason it does not."""
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return None


def fresh_schema() -> str:
    """A schema name no other test run uses."""
    return f"mayfly_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def with_options(url: str, **options: object) -> str:
    """Append Mayfly options to a server URL."""
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return url + ("&" if "?" in url else "?") + query


def drop_schema(url: str, schema: str) -> None:
    """Drop a test schema (and everything in it)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(schema))
        )


PROXY = Path(__file__).with_name("dropproxy.py")
IDS = Uuid7IdSource()


def batch(run_id: str, first: int, count: int = 3) -> list[JournalRecord]:
    """``count`` sealed records of ``run_id`` from sequence ``first``."""
    return [
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=IDS.new_id(),
            event_type="Probe",
            schema_version=1,
            payload=b'{"n":%d}' % sequence,
        )
        for sequence in range(first, first + count)
    ]


class Proxy:
    """The drop proxy in its own process, in front of the test server."""

    def __init__(self, server: str, marker: str, mode: str) -> None:
        parts = urlsplit(server)
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(PROXY),
                parts.hostname or "127.0.0.1",
                str(parts.port or 5432),
                marker,
                mode,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline().split()[1])
        netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        self.url = parts._replace(netloc=f"{netloc}:{self.port}").geturl()

    def dropped(self) -> bool:
        """Whether the proxy reported cutting a connection (waits for the line)."""
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip() == "dropped"

    def close(self) -> None:
        """Kill the proxy process."""
        self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
