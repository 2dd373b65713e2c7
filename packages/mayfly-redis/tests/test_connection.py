"""Cooperative I/O: redis-py's socket waits park on the greenlet hub instead of blocking it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis._parsers import _HiredisParser, _RESP2Parser

from mayfly.model.errors import JournalUnavailable, TaskCancelled
from mayfly.substrate import Hub, now_ms, sleep, spawn
from mayfly_redis import HubConnection, HubSocket, RedisJournal
from mayfly_redis._client import open_store
from mayfly_redis._connection import resolve
from mayfly_redis.testing import RedisClusterNodes, RedisServer

if TYPE_CHECKING:
    from conftest import Records

NEVER = "mayfly-test:{never}:list"


@pytest.mark.parametrize("deployment", ["aof_server", "aof_cluster"])
def test_slow_command_does_not_delay_a_hub_timer(request: pytest.FixtureRequest, deployment: str) -> None:
    """While one task waits 1 s on BLPOP (standalone or Cluster), a 50 ms hub timer fires first."""
    server: RedisServer | RedisClusterNodes = request.getfixturevalue(deployment)
    store = open_store(server.url)
    assert store.cluster == (deployment == "aof_cluster")
    order: list[str] = []

    def slow() -> None:
        assert store.call("slow", "BLPOP", NEVER, 1) is None
        order.append("slow command returned")

    def main() -> None:
        task = spawn(slow, name="slow")
        started = now_ms()
        sleep(0.05)
        order.append("timer fired")
        task.join()
        assert now_ms() - started >= 900  # BLPOP really waited on the server

    hub = Hub()
    hub.run(main)
    store.close()
    assert order == ["timer fired", "slow command returned"]
    assert hub.stats().offloads_completed == 0, "the wait parked on the socket, not on an offload thread"


def test_connections_use_the_python_parser_and_hub_sockets(aof_server: RedisServer) -> None:
    """Pooled connections parse with the pure-Python RESP2 parser (never hiredis' own poll) over a HubSocket."""
    store = open_store(aof_server.url)
    try:
        store.call("ping", "PING")
        pool = store._client.connection_pool
        connection = pool.get_connection()
        try:
            assert isinstance(connection, HubConnection)
            assert isinstance(connection._parser, _RESP2Parser)
            assert isinstance(connection._sock, HubSocket)
        finally:
            pool.release(connection)
    finally:
        store.close()


def test_hiredis_is_never_installed_as_the_parser() -> None:
    """Even when asked for the hiredis parser (which polls the descriptor itself), the connection uses RESP2."""
    connection = HubConnection(host="127.0.0.1", port=1, parser_class=_HiredisParser, protocol=3)
    assert isinstance(connection._parser, _RESP2Parser)
    assert connection.protocol == 2


def test_numeric_hosts_resolve_in_place_and_names_through_offload(aof_server: RedisServer) -> None:
    """On the hub, 127.0.0.1 is resolved without a thread; 'localhost' goes through offload."""
    numeric = Hub()
    numeric.run(lambda: resolve("127.0.0.1", aof_server.port))
    assert numeric.stats().offloads_completed == 0
    named = Hub()
    addresses = named.run(lambda: resolve("localhost", aof_server.port))
    assert named.stats().offloads_completed == 1
    assert addresses
    by_name = Hub()
    url = aof_server.url.replace("127.0.0.1", "localhost")
    assert by_name.run(lambda: open_store(url).call("ping", "PING")) in (True, b"PONG")


def test_cancelled_wait_leaves_the_pool_usable(aof_server: RedisServer) -> None:
    """Cancelling a task parked on a Redis reply raises TaskCancelled; the next command works."""
    store = open_store(aof_server.url)

    def main() -> object:
        task = spawn(lambda: store.call("slow", "BLPOP", NEVER, 5), name="blocked")
        sleep(0.05)
        task.cancel("test cancels the wait")
        with pytest.raises(TaskCancelled):
            task.join()
        return store.call("ping", "PING")

    try:
        assert Hub().run(main) in (True, b"PONG")
        assert store.call("ping", "PING") in (True, b"PONG")
    finally:
        store.close()


def test_url_timeout_bounds_a_wait_and_maps_to_journal_unavailable(aof_server: RedisServer) -> None:
    """A reply slower than ?timeout= raises JournalUnavailable, on the hub and off it."""
    store = open_store(aof_server.url + "?timeout=0.2")
    try:
        with pytest.raises(JournalUnavailable, match="unreachable"):
            store.call("slow", "BLPOP", NEVER, 2)

        def on_hub() -> None:
            with pytest.raises(JournalUnavailable, match="unreachable"):
                store.call("slow", "BLPOP", NEVER, 2)

        Hub().run(on_hub)
    finally:
        store.close()


@pytest.mark.parametrize("on_hub", [False, True])
def test_hub_socket_timeouts_and_non_blocking_reads(on_hub: bool) -> None:
    """A silent peer: timeout 0 raises BlockingIOError at once, a positive timeout raises TimeoutError."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        raw = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        sock = HubSocket(raw)

        def check() -> None:
            sock.settimeout(0)
            with pytest.raises(BlockingIOError):
                sock.recv(16)
            sock.settimeout(0.05)
            with pytest.raises(TimeoutError):
                sock.recv(16)
            peer.sendall(b"+PONG\r\n")
            assert sock.recv(16) == b"+PONG\r\n"
            sock.sendall(b"x" * 100_000)
            received = 0
            while received < 100_000:
                received += len(peer.recv(65536))

        try:
            if on_hub:
                Hub().run(check)
            else:
                check()
        finally:
            sock.close()
            peer.close()


def test_refused_connection_maps_to_journal_unavailable() -> None:
    """Connecting to a closed loopback port raises JournalUnavailable naming the address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(JournalUnavailable, match=f"127.0.0.1:{port}"):
        Hub().run(lambda: open_store(f"redis://127.0.0.1:{port}/0"))
    with pytest.raises(JournalUnavailable, match=f"127.0.0.1:{port}"):
        open_store(f"redis://127.0.0.1:{port}/0")


TLS = Path(__file__).resolve().parent / "tls"


def test_tls_handshake_and_commands_park_on_the_hub(records: Records) -> None:
    """rediss:// verifies the server certificate, and its waits park on the hub like plain TCP."""
    with RedisServer(tls=TLS) as server:
        store = open_store(server.tls_url)
        order: list[str] = []

        def slow() -> None:
            assert store.call("slow", "BLPOP", NEVER, 1) is None
            order.append("slow command returned")

        def main() -> None:
            task = spawn(slow, name="slow")
            sleep(0.05)
            order.append("timer fired")
            task.join()

        try:
            assert isinstance(store._client.connection_pool.get_connection()._sock, HubSocket)
            Hub().run(main)
            assert order == ["timer fired", "slow command returned"]
        finally:
            store.close()
        fresh = Hub()
        run = records.new_id()

        def append_on_hub() -> int:
            with RedisJournal(server.tls_url) as journal:  # connect and TLS handshake on the hub
                journal.append(run, 1, records.batch(run, 1, 3))
                return journal.next_sequence(run)

        assert fresh.run(append_on_hub) == 4


def test_tls_refuses_an_untrusted_server() -> None:
    """Without the test CA the server certificate does not verify: JournalUnavailable, nothing opened."""
    with RedisServer(tls=TLS) as server:
        untrusted = server.tls_url.split("?", 1)[0]
        with pytest.raises(JournalUnavailable, match="certificate verify failed"):
            open_store(untrusted)


def test_concurrent_hub_tasks_each_get_their_own_connection(
    aof_server: RedisServer, records: Records
) -> None:
    """Twenty hub tasks appending at once to their own runs all succeed over one journal's pool."""
    journal = RedisJournal(aof_server.url)
    runs = [records.new_id() for _ in range(20)]
    work = {run: [records.batch(run, 1 + 2 * i, 2) for i in range(10)] for run in runs}

    def writer(run: str) -> int:
        for batch in work[run]:
            journal.append(run, batch[0].sequence, batch)
        return journal.next_sequence(run)

    def main() -> list[int]:
        tasks = [spawn(lambda run=run: writer(run), name=f"writer-{index}") for index, run in enumerate(runs)]
        return [task.join() for task in tasks]

    try:
        hub = Hub()
        assert hub.run(main) == [21] * len(runs)
        assert hub.stats().offloads_completed == 0
        for run in runs:
            assert journal.read(run) == [record for batch in work[run] for record in batch]
        pool = journal._store._client.connection_pool
        assert 1 < len(pool._available_connections) <= len(runs)
    finally:
        journal.close()
