"""Opening a Redis backend: honest durability checks, credential and script errors, all typed."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest
import redis

from mayfly.model.errors import DurabilityUnavailable, JournalUnavailable
from mayfly.plugins import open_journal, open_leases
from mayfly_redis import RedisJournal, _scripts
from mayfly_redis._client import open_store
from mayfly_redis._connection import HubConnection
from mayfly_redis.testing import RedisClusterNodes, RedisServer, legacy_cluster_store

if TYPE_CHECKING:
    from conftest import Records


def _admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, protocol=2)


def test_aof_mode_refuses_a_server_without_persistence(records: Records) -> None:
    """durability=aof against appendonly no refuses to open and says exactly what to configure."""
    with RedisServer(appendfsync=None) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        for opener in (open_journal, open_leases):
            with pytest.raises(DurabilityUnavailable) as caught:
                opener(url)
            message = str(caught.value)
            assert "appendonly no" in message
            assert "'appendonly yes' and 'appendfsync always'" in message
            assert "?durability=memory" in message
        with open_journal(url + "?durability=memory") as journal:
            run = records.new_id()
            journal.append(run, 1, records.batch(run, 1))


def test_aof_mode_refuses_appendfsync_everysec() -> None:
    """AOF with appendfsync everysec can lose a second of acknowledged records: refused."""
    with RedisServer(appendfsync="everysec") as server:
        with pytest.raises(DurabilityUnavailable, match="appendfsync everysec"):
            open_journal(f"redis://127.0.0.1:{server.port}/0")
        admin = _admin(server)
        admin.config_set("appendfsync", "always")
        with open_journal(f"redis://127.0.0.1:{server.port}/0") as journal:
            assert journal.durability == "durable"
        admin.close()


@pytest.mark.parametrize("durability", ["aof", "memory"])
def test_evicting_memory_policy_is_refused_in_both_modes(fresh_server: RedisServer, durability: str) -> None:
    """maxmemory-policy allkeys-* could evict journal records: refused whatever durability is asked."""
    admin = _admin(fresh_server)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(DurabilityUnavailable, match="noeviction"):
        open_journal(f"redis://127.0.0.1:{fresh_server.port}/0?durability={durability}")
    admin.config_set("maxmemory-policy", "volatile-lru")  # evicts only keys with a TTL: leases
    open_journal(f"redis://127.0.0.1:{fresh_server.port}/0?durability={durability}").close()
    admin.close()


def test_unverifiable_persistence_is_refused_in_aof_mode(fresh_server: RedisServer) -> None:
    """A user without CONFIG cannot verify AOF: aof mode refuses, memory mode opens."""
    admin = _admin(fresh_server)
    admin.execute_command("ACL", "SETUSER", "limited", "on", ">secret", "~*", "+@all", "-config")
    url = f"redis://limited:secret@127.0.0.1:{fresh_server.port}/0"
    with pytest.raises(DurabilityUnavailable, match="refused CONFIG GET"):
        open_journal(url)
    with open_journal(url + "?durability=memory") as journal:
        assert "secret" not in journal.url
        assert "***" in journal.url
    admin.close()


def test_wrong_password_is_journal_unavailable(fresh_server: RedisServer) -> None:
    """Bad credentials raise JournalUnavailable naming the address, never a redis-py error."""
    admin = _admin(fresh_server)
    admin.execute_command("ACL", "SETUSER", "someone", "on", ">right", "~*", "+@all")
    with pytest.raises(JournalUnavailable, match="credentials") as caught:
        open_journal(f"redis://someone:wrong@127.0.0.1:{fresh_server.port}/0")
    assert "wrong" not in str(caught.value)
    admin.close()


def test_flushed_scripts_are_reloaded(aof_server: RedisServer, run_id: str, records: Records) -> None:
    """After SCRIPT FLUSH the next append gets NOSCRIPT, reloads the script and succeeds."""
    with RedisJournal(aof_server.url) as journal:
        admin = _admin(aof_server)
        journal.append(run_id, 1, records.batch(run_id, 1))
        sha = hashlib.sha1(_scripts.APPEND.encode()).hexdigest()
        assert admin.script_exists(sha) == [True]
        admin.script_flush()
        assert admin.script_exists(sha) == [False]
        journal.append(run_id, 2, records.batch(run_id, 2))
        assert admin.script_exists(sha) == [True]
        admin.close()
        assert journal.next_sequence(run_id) == 3


def test_standalone_server_serves_any_database(aof_server: RedisServer) -> None:
    """A standalone server is not mistaken for a Cluster and serves any database number."""
    store = open_store(aof_server.url.replace("/0", "/3"))
    try:
        assert not store.cluster
        assert store.target.db == 3
    finally:
        store.close()


def test_cluster_is_detected_and_every_primary_checked(aof_cluster: RedisClusterNodes) -> None:
    """On a Cluster the store routes by slot, checks AOF on all three primaries and uses hub sockets."""
    store = open_store(aof_cluster.url)
    try:
        assert store.cluster
        assert store.persistence.count("appendfsync always") == 3
        store.call("ping", "SET", "mayfly-test:{probe}:k", b"v")
        for node in store._client.get_primaries():
            assert issubclass(node.redis_connection.connection_pool.connection_class, HubConnection)
    finally:
        store.close()


def test_cluster_refuses_a_database_other_than_zero(aof_cluster: RedisClusterNodes) -> None:
    """A Cluster has only database 0; another number is refused with a hint."""
    with pytest.raises(JournalUnavailable, match="only database 0"):
        open_store(aof_cluster.url.replace("/0", "/2"))


def test_cluster_without_persistence_is_refused_in_aof_mode() -> None:
    """Every primary is checked: a Cluster without AOF refuses durability=aof, accepts memory."""
    with RedisClusterNodes(appendfsync=None) as cluster:
        with pytest.raises(DurabilityUnavailable, match="appendonly no"):
            open_journal(cluster.url.replace("?durability=memory", ""))
        with open_journal(cluster.url) as journal:
            assert journal.durability == "memory"


def test_cluster_listing_skips_runs_that_never_committed(
    aof_cluster: RedisClusterNodes, records: Records
) -> None:
    """A pre-sharding Cluster store lists a run before its first append; a failed one is not listed."""
    legacy_cluster_store(aof_cluster, "clusterlist")
    with RedisJournal(aof_cluster.url + "?prefix=clusterlist") as journal:
        assert journal.cluster
        committed = records.new_id()
        journal.append(committed, 1, records.batch(committed, 1))
        failed = records.new_id()
        journal.append(failed, 1, records.batch(failed, 1), fence=None)
        journal.remove_record(failed, 1)  # as if the first append had never landed
        listed = journal.list_runs(limit=100_000)
        assert committed in listed
        assert failed not in listed


def test_user_without_info_opens_standalone(fresh_server: RedisServer, records: Records) -> None:
    """A user barred from INFO (but allowed CONFIG GET) still opens and appends on a standalone server."""
    admin = _admin(fresh_server)
    admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info")
    with open_journal(f"redis://noinfo:pw@127.0.0.1:{fresh_server.port}/0") as journal:
        run = records.new_id()
        journal.append(run, 1, records.batch(run, 1))
        assert journal.next_sequence(run) == 2
    admin.close()


def test_server_restarted_without_aof_is_refused_on_reconnect(
    fresh_server: RedisServer, run_id: str, records: Records
) -> None:
    """An aof journal whose server comes back without AOF refuses to append; with AOF back, it appends."""
    with RedisJournal(fresh_server.url) as journal:
        journal.append(run_id, 1, records.batch(run_id, 1))
        fresh_server.kill()
        fresh_server.appendfsync = "everysec"
        fresh_server.start()
        with pytest.raises(DurabilityUnavailable, match="appendfsync everysec"):
            journal.append(run_id, 2, records.batch(run_id, 2))
        with pytest.raises(DurabilityUnavailable):
            journal.next_sequence(run_id)
        fresh_server.kill()
        fresh_server.appendfsync = "always"
        fresh_server.start()
        journal.append(run_id, 2, records.batch(run_id, 2))
        assert [record.sequence for record in journal.read(run_id)] == [1, 2]


def test_memory_mode_does_not_recheck_on_reconnect(fresh_server: RedisServer, records: Records) -> None:
    """A durability=memory journal keeps working when the server comes back without persistence."""
    with RedisJournal(fresh_server.url + "?durability=memory") as journal:
        fresh_server.kill()
        fresh_server.appendfsync = None
        fresh_server.start()
        run = records.new_id()
        journal.append(run, 1, records.batch(run, 1))
        assert journal.next_sequence(run) == 2
