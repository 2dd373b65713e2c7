"""The simulator's fault proxy (``mayfly_contract.sim._netproxy``) in front of a real PostgreSQL.

psycopg talks to the server through the proxy while the test delays, drops,
cuts and refuses its connections, and cuts one mid-commit: the server commits
the INSERT, the client gets a connection error, and a direct connection finds
the row. The private cluster of :mod:`mayfly_contract.sim._servers` is crashed
and restarted under the proxy. Last, one seed of each of the simulator's
process families (``sigkill``, ``net``, ``workers``) runs on PostgreSQL.
"""

from __future__ import annotations

import io
import select
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from mayfly_contract.sim import run_campaign
from mayfly_contract.sim._netproxy import NetProxy
from mayfly_contract.sim._servers import PG_PORTS, PrivateCluster


def _target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}"


@pytest.fixture
def table(server: str) -> Iterator[sql.Composed]:
    """A table of this test's own in a schema of its own (``simnet_proxy_*``), dropped afterwards."""
    schema = f"simnet_proxy_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        connection.execute(sql.SQL("CREATE TABLE {}.t (k text PRIMARY KEY)").format(sql.Identifier(schema)))
    yield sql.SQL("{}.t").format(sql.Identifier(schema))
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def proxy(server: str) -> Iterator[NetProxy]:
    with NetProxy(_target(server), seed=7) as made:
        yield made


def test_delay_holds_every_round_trip_back(proxy: NetProxy, server: str) -> None:
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        proxy.delay(120)
        started = time.monotonic()
        assert connection.execute("SELECT 41 + 1").fetchone() == (42,)
        held = time.monotonic() - started
        proxy.heal()
        assert connection.execute("SELECT 1").fetchone() == (1,)
    assert held >= 0.24, f"a delayed round trip (120 ms each way) took {held:.3f} s"


def test_drop_is_a_blackhole_until_healed(proxy: NetProxy, server: str) -> None:
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        proxy.drop()
        pgconn = connection.pgconn
        pgconn.send_query(b"SELECT 7")
        pgconn.flush()
        readable, _, _ = select.select([pgconn.socket], [], [], 0.5)
        assert not readable, "an answer came through a dropped proxy"
        assert proxy.stats()["open"] == 1, "drop closed the connection instead of holding it"
        proxy.heal()
        readable, _, _ = select.select([pgconn.socket], [], [], 10)
        assert readable, "no answer 10 s after heal"
        while pgconn.is_busy():
            pgconn.consume_input()
        result = pgconn.get_result()
        assert result is not None and result.get_value(0, 0) == b"7"
        while pgconn.get_result() is not None:
            pass


def test_cut_resets_open_connections_and_new_ones_work(proxy: NetProxy, server: str) -> None:
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)
        proxy.cut()
        with pytest.raises(psycopg.OperationalError):
            connection.execute("SELECT 1")
    assert proxy.stats()["cuts"] == 1
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        assert connection.execute("SELECT 2").fetchone() == (2,)


def test_refuse_resets_new_connections_until_healed(proxy: NetProxy, server: str) -> None:
    proxy.refuse()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(proxy.url(server), connect_timeout=5)
    proxy.heal()
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        assert connection.execute("SELECT 3").fetchone() == (3,)
    assert proxy.stats()["refused"] == 1


def test_cut_mid_commit_is_an_ambiguous_commit(proxy: NetProxy, server: str, table: sql.Composed) -> None:
    """The INSERT commits on the server; the client only sees its connection fail."""
    with psycopg.connect(proxy.url(server), autocommit=True) as connection:
        connection.execute(sql.SQL("INSERT INTO {} VALUES ('before')").format(table))
        proxy.cut_mid_commit(b"INSERT")
        with pytest.raises(psycopg.OperationalError):
            connection.execute(sql.SQL("INSERT INTO {} VALUES ('ambiguous')").format(table))
    assert proxy.wait_ambiguous(1, timeout=10)
    with psycopg.connect(server, autocommit=True) as direct:
        rows = direct.execute(sql.SQL("SELECT k FROM {} ORDER BY k").format(table)).fetchall()
    assert rows == [("ambiguous",), ("before",)]


def test_a_crashed_private_cluster_comes_back_through_the_proxy(cluster_binaries: None) -> None:
    cluster = PrivateCluster(ports=PG_PORTS)
    try:
        assert cluster.port in PG_PORTS
        with NetProxy(_target(cluster.url)) as proxy:
            with psycopg.connect(proxy.url(cluster.url), autocommit=True) as connection:
                connection.execute("CREATE TABLE kept (k int)")
                connection.execute("INSERT INTO kept VALUES (1)")
            with psycopg.connect(proxy.url(cluster.url), autocommit=True) as connection:
                cluster.restart()
                with pytest.raises(psycopg.OperationalError):
                    connection.execute("SELECT 1")
            with psycopg.connect(proxy.url(cluster.url), autocommit=True) as connection:
                assert connection.execute("SELECT k FROM kept").fetchall() == [(1,)]
    finally:
        cluster.destroy()


CAMPAIGN_SCHEMA = "simnet_campaign"


@pytest.mark.parametrize(("family", "workers"), [("sigkill", 1), ("net", 1), ("workers", 2)])
def test_one_seed_of_each_process_family(
    family: str, workers: int, server: str, cluster_binaries: None, tmp_path: Path
) -> None:
    """One seed of ``sigkill``, ``net`` (a private cluster behind proxies) and ``workers`` through the driver."""
    out = io.StringIO()
    url = f"{server}{'&' if '?' in server else '?'}schema={CAMPAIGN_SCHEMA}"
    campaign = run_campaign(
        "postgres", [1], family=family, workers=workers, url=url, directory=tmp_path, out=out
    )
    assert campaign.results[1].family == family
    assert campaign.violations == 0, out.getvalue()
    assert out.getvalue().endswith("1 seeds, 0 violations\n")
