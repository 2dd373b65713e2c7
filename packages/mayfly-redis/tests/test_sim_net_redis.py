"""The simulator's fault proxy (``mayfly_contract.sim._netproxy``) in front of a real, durable Redis.

redis-py talks to a private AOF ``always`` server through the proxy while the
test delays, drops, cuts and refuses its connections, and cuts one
mid-commit: the server applies the SET, the client gets a connection error,
and a direct client reads the value. The server is SIGKILLed and restarted
under the proxy (``mayfly_contract.sim._servers.PrivateRedis``). Last, one
seed of each of the simulator's process families (``sigkill``, ``net``,
``workers``) runs on Redis.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mayfly_contract.sim import run_campaign
from mayfly_contract.sim._netproxy import NetProxy
from mayfly_contract.sim._servers import PrivateRedis
from mayfly_redis.testing import RedisServer

PREFIX = "simnet:proxy:"


@pytest.fixture
def proxy(aof_server: RedisServer) -> Iterator[NetProxy]:
    with NetProxy(f"127.0.0.1:{aof_server.port}", seed=11) as made:
        yield made


def _client(port: int, timeout: float = 10) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout, retry=None)


def test_delay_holds_every_round_trip_back(proxy: NetProxy) -> None:
    client = _client(proxy.port)
    assert client.ping()
    proxy.delay(120)
    started = time.monotonic()
    assert client.ping()
    held = time.monotonic() - started
    proxy.heal()
    client.close()
    assert held >= 0.24, f"a delayed round trip (120 ms each way) took {held:.3f} s"


def test_drop_is_a_blackhole_until_healed(proxy: NetProxy) -> None:
    client = _client(proxy.port, timeout=0.5)
    assert client.ping()
    proxy.drop()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert proxy.stats()["open"] == 1, "drop closed the connection instead of holding it"
    proxy.heal()
    client.close()
    assert _client(proxy.port).ping()


def test_cut_resets_open_connections_and_new_ones_work(proxy: NetProxy) -> None:
    client = _client(proxy.port)
    connection = client.connection_pool.get_connection()
    connection.send_command("PING")
    assert connection.read_response() in (b"PONG", "PONG")
    proxy.cut()
    with pytest.raises(redis.ConnectionError):
        connection.send_command("PING")
        connection.read_response()
    connection.disconnect()
    assert proxy.stats()["cuts"] == 1
    assert _client(proxy.port).ping()


def test_refuse_resets_new_connections_until_healed(proxy: NetProxy) -> None:
    proxy.refuse()
    with pytest.raises(redis.ConnectionError):
        _client(proxy.port).ping()
    proxy.heal()
    assert _client(proxy.port).ping()
    assert proxy.stats()["refused"] >= 1


def test_cut_mid_commit_is_an_ambiguous_commit(proxy: NetProxy, aof_server: RedisServer) -> None:
    """The SET is applied (and fsynced) by the server; the client only sees its connection fail."""
    key = PREFIX + "ambiguous"
    direct = _client(aof_server.port)
    direct.delete(key)
    client = _client(proxy.port)
    assert client.ping()
    proxy.cut_mid_commit(b"SET")
    with pytest.raises(redis.ConnectionError):
        client.set(key, "committed")
    assert proxy.wait_ambiguous(1, timeout=10)
    assert direct.get(key) == b"committed"
    direct.delete(key)


def test_a_killed_private_redis_comes_back_through_the_proxy_with_its_aof() -> None:
    server = PrivateRedis()
    try:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        with NetProxy(f"127.0.0.1:{port}") as proxy:
            client = _client(proxy.port)
            client.set(PREFIX + "kept", "1")
            connection = client.connection_pool.get_connection()
            server.restart()
            with pytest.raises(redis.ConnectionError):
                connection.send_command("PING")
                connection.read_response()
            connection.disconnect()
            client.close()
            assert _client(proxy.port).get(PREFIX + "kept") == b"1"
    finally:
        server.destroy()


# The driver clears its Redis namespace; this one is the tests' own (the families use private servers).
CAMPAIGN_URL = "redis://127.0.0.1:6379/0?durability=memory&prefix=simnet.campaign"


@pytest.mark.parametrize(("family", "workers"), [("sigkill", 1), ("net", 1), ("workers", 2)])
def test_one_seed_of_each_process_family(family: str, workers: int, tmp_path: Path) -> None:
    """One seed of ``sigkill``, ``net`` (a private AOF server behind proxies) and ``workers`` through the driver."""
    out = io.StringIO()
    campaign = run_campaign(
        "redis", [1], family=family, workers=workers, url=CAMPAIGN_URL, directory=tmp_path, out=out
    )
    assert campaign.results[1].family == family
    assert campaign.violations == 0, out.getvalue()
    assert out.getvalue().endswith("1 seeds, 0 violations\n")
