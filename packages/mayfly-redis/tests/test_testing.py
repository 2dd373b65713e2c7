"""The private redis-server test tooling: AOF always, kill and restart on the same files."""

from __future__ import annotations

import redis

from mayfly_redis.testing import RedisServer, aof_backend


def test_private_server_persists_across_sigkill() -> None:
    """A key written to the private server survives SIGKILL and restart on the same AOF."""
    with RedisServer() as server:
        client = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.set("k", "v")
        client.close()
        server.kill()
        server.start()
        client = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
        assert client.get("k") == b"v"
        client.close()
        directory = server.directory
    assert not directory.exists()


def test_server_without_persistence_has_a_memory_url() -> None:
    """appendfsync=None starts appendonly no and its URL asks for durability=memory."""
    with RedisServer(appendfsync=None) as server:
        assert server.url.endswith("?durability=memory")
        client = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.close()


def test_contract_factory_reuses_one_server() -> None:
    """aof_backend starts one server per process and returns the same URL each time."""
    assert aof_backend() == aof_backend()
