"""One Redis deployment behind a backend URL: the client, its errors, its scripts and its durability check.

Every driver exception is mapped here into Mayfly's hierarchy, so the journal
and the lease store never let a ``redis.exceptions`` error reach a user.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any, Final, final

import redis
import redis.exceptions as driver
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from mayfly.errors import CompatibilityError, CorruptionError, DurabilityUnavailable, JournalUnavailable
from mayfly.journal import Relay
from mayfly_redis._connection import (
    AofPolicy,
    DurabilityLost,
    HubConnection,
    HubSSLConnection,
    _on_hub,
    bound_to,
)
from mayfly_redis._layout import DEFAULT_SHARDS, MAX_SHARDS, Layout, LayoutKind
from mayfly_redis._pipeline import Pipeline
from mayfly_redis._url import RedisDurability, RedisTarget, parse_url

__all__ = ["RedisStore", "open_store", "relayed_store"]

# Policies that may evict keys without a TTL, i.e. journal records.
_EVICTING: Final = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})
# A connection per hub task awaiting a reply at once (a worker drives up to its concurrency of runs):
# redis-py's pools cannot make a task wait for a free connection without blocking the hub, so the
# bound is set well above any worker's concurrency and below the server's default maxclients (10000).
_MAX_CONNECTIONS: Final = 4096
_UNSENT: Final = object()
# Replies after which a Cluster command is sent again through redis-py's redirection handling.
_REDIRECTED: Final = (
    driver.AskError,
    driver.TryAgainError,
    driver.ClusterDownError,
    driver.ConnectionError,
    driver.TimeoutError,
)


def _pack(args: Sequence[Any]) -> bytes:
    """One command in RESP (bytes, str or int arguments), as redis-py's packer would write it."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is bytes:
            data = arg
        elif kind is str or isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytearray | memoryview):
            data = bytes(arg)
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = str(arg).encode()
        else:  # a float or a bool would be a bug here: refused, never rounded
            raise TypeError(f"Redis command argument {arg!r:.40} is not bytes, str or int")
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _config(node: Any, name: str) -> str | None:
    """Return one CONFIG value of ``node`` (a standalone client), ``None`` if it is not reported."""
    reply = node.execute_command("CONFIG", "GET", name)
    if isinstance(reply, dict):
        pairs = [(_text(key), _text(value)) for key, value in reply.items()]
    else:
        items = [_text(item) for item in reply]
        pairs = list(zip(items[0::2], items[1::2], strict=True))
    return dict(pairs).get(name)


@final
class RedisStore:
    """A connection pool to a standalone Redis or a Redis Cluster, with mapped errors and cached scripts."""

    def __init__(self, target: RedisTarget, *, relay: Relay | None = None) -> None:
        self.target = target
        self.cluster = False
        # Where to dial each node (the contract suite's slow relay); None: the addresses as given.
        self._relay = relay
        self._shas: dict[str, str] = {}
        self._closed = False
        # Standalone scripts skip redis-py's command machinery (the hot path of every append): idle
        # connections of the same pool, taken and given back without its bookkeeping.
        self._idle: list[Any] = []
        # Pipelines of hub tasks' scripts, one per server and thread (a hub runs on one thread).
        self._local = threading.local()
        self._pipelines: list[Pipeline] = []
        self._pipelines_lock = threading.Lock()
        self._aof = AofPolicy()
        self._connection_class = bound_to(HubSSLConnection if target.tls else HubConnection, self._aof)
        self._client: Any = self._standalone()
        try:
            with self.errors("open"):
                try:
                    self._client.ping()
                except driver.ResponseError as error:
                    if "cluster mode" in str(error):  # SELECT of a database other than 0
                        raise JournalUnavailable(self._cluster_db_message()) from None
                    raise
                if self._is_cluster():
                    self._client.close()
                    self._client = self._cluster()
                    self.cluster = True
                self.persistence = self._check_durability()
                self.layout = self._choose_layout()
                # From now on every (re)connection re-verifies AOF: a server restarted
                # without it must not acknowledge appends.
                self._aof.required = target.durability is RedisDurability.AOF
        except BaseException:
            self.close()
            raise

    # -- construction ----------------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        target = self.target
        return {
            "username": target.username,
            "password": target.password,
            "socket_timeout": target.timeout_s,
            "socket_connect_timeout": target.timeout_s,
            # RESP2 with the pure-Python parser (see _connection); RESP3 would switch on
            # push-notification handling that needs hiredis or the RESP3 parser.
            "protocol": 2,
            # One immediate retry covers a pooled connection the server closed; never a
            # sleeping backoff, which would block the hub.
            "retry": Retry(NoBackoff(), 1),
            **({"ssl_ca_certs": target.ca_certs} if target.tls and target.ca_certs else {}),
        }

    def _standalone(self) -> redis.Redis:
        target = self.target
        pool = redis.ConnectionPool(
            connection_class=self._connection_class,
            host=target.host,
            port=target.port,
            db=target.db,
            max_connections=_MAX_CONNECTIONS,
            driver_info=None,  # no CLIENT SETINFO: two round trips less per new connection
            **self._options(),
        )
        return redis.Redis(connection_pool=pool)

    def _cluster(self) -> RedisCluster:
        if self.target.db != 0:
            raise JournalUnavailable(self._cluster_db_message())
        # Only the url= form makes redis-py build each node's pool from our
        # connection_class; a plain host/port form passes it to Redis(), which refuses it.
        relay = self._relay
        return RedisCluster(
            url=f"redis://{self.target.host}:{self.target.port}/0",
            connection_class=self._connection_class,
            address_remap=None if relay is None else (lambda address: relay(*address)),
            max_connections=_MAX_CONNECTIONS,
            **self._options(),
        )

    def _is_cluster(self) -> bool:
        try:
            cluster_info = self._client.info("cluster")
        except driver.NoPermissionError:
            return False  # a user barred from INFO: a Cluster would answer MOVED later, mapped
        return int(cluster_info.get("cluster_enabled", 0)) == 1

    def _choose_layout(self) -> Layout:
        """The store's key layout (see :mod:`mayfly_redis._layout`); a Cluster store records it once."""
        target = self.target
        prefix, asked = target.prefix, target.shards
        if not self.cluster:
            if asked is not None:
                raise CompatibilityError(
                    f"redis {target.address} is a standalone server, which keeps one run index: "
                    "drop shards= from the URL (it applies to a new Redis Cluster store)"
                )
            return Layout(LayoutKind.STANDALONE, prefix)
        marker = Layout(LayoutKind.SHARDED, prefix).marker_key
        stored = self._client.execute_command("GET", marker)
        if stored is None:
            if int(self._client.execute_command("EXISTS", f"{prefix}:runs")):
                if asked is not None:
                    raise CompatibilityError(
                        f"the Redis Cluster store with prefix {prefix!r} was written before run-index "
                        "sharding (it has no run index), so shards= cannot apply to it: drop shards= "
                        "to keep using it as a journal, or use a new prefix for a sharded store"
                    )
                return Layout(LayoutKind.UNSHARDED, prefix)
            wanted = f"sharded {DEFAULT_SHARDS if asked is None else asked}"
            self._client.execute_command("SET", marker, wanted, "NX")
            stored = self._client.execute_command("GET", marker)
        text = _text(stored)
        kind, _, count = text.partition(" ")
        if kind != "sharded" or not count.isdigit() or not 1 <= int(count) <= MAX_SHARDS:
            raise CorruptionError(
                f"the layout marker {marker} of the Redis Cluster store reads {text[:60]!r}, not "
                f"'sharded <1-{MAX_SHARDS}>'; restore it from a backup (it names the store's shards)"
            )
        shards = int(count)
        if asked is not None and asked != shards:
            raise CompatibilityError(
                f"the Redis Cluster store with prefix {prefix!r} has {shards} run-index shards, not the "
                f"{asked} the URL asks for (shards are fixed when a store is created); use shards={shards} "
                "or drop shards= from the URL"
            )
        return Layout(LayoutKind.SHARDED, prefix, shards)

    def _cluster_db_message(self) -> str:
        return (
            f"redis {self.target.address} is a Redis Cluster, which has only database 0; "
            "drop the /db part of the URL"
        )

    def _nodes(self) -> list[Any]:
        """Standalone clients for every server that stores data (each Cluster primary)."""
        if not self.cluster:
            return [self._client]
        return [node.redis_connection for node in self._client.get_primaries()]

    def _check_durability(self) -> str:
        """Verify the servers can honour the URL's durability; return what was found, for reports."""
        target = self.target
        found: list[str] = []
        for node in self._nodes():
            where = f"{node.get_connection_kwargs().get('host')}:{node.get_connection_kwargs().get('port')}"
            try:
                appendonly = _config(node, "appendonly")
                appendfsync = _config(node, "appendfsync")
                policy = _config(node, "maxmemory-policy")
            except driver.ResponseError as error:
                if target.durability is RedisDurability.MEMORY:
                    found.append(f"{where}: persistence unknown (CONFIG refused)")
                    continue
                raise DurabilityUnavailable(
                    f"redis {where} refused CONFIG GET ({error}), so durability=aof cannot be "
                    "verified; allow CONFIG for this user, or open with ?durability=memory"
                ) from None
            if policy in _EVICTING:
                raise DurabilityUnavailable(
                    f"redis {where} has maxmemory-policy {policy}, which can evict journal records; "
                    "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction)"
                )
            if target.durability is RedisDurability.AOF and (appendonly != "yes" or appendfsync != "always"):
                raise DurabilityUnavailable(
                    f"redis {where} has appendonly {appendonly} and appendfsync {appendfsync}, so "
                    "acknowledged records could be lost in a crash; durability=aof needs "
                    "'appendonly yes' and 'appendfsync always' in redis.conf (or CONFIG SET "
                    "appendonly yes; CONFIG SET appendfsync always), or open with ?durability=memory "
                    "to accept that risk"
                )
            found.append(f"{where}: appendonly {appendonly}, appendfsync {appendfsync}")
        return "; ".join(found)

    # -- calls -----------------------------------------------------------------------------------

    @contextmanager
    def errors(self, operation: str) -> Iterator[None]:
        """Map every redis-py error raised in the block to ``JournalUnavailable`` naming ``operation``."""
        if self._closed:
            raise JournalUnavailable(f"{operation}: the Redis backend {self.target.url} is closed")
        try:
            yield
        except DurabilityLost as error:
            raise DurabilityUnavailable(
                f"{operation}: {error}, so acknowledged records could be lost in a crash; restore "
                "'appendonly yes' and 'appendfsync always', or reopen with ?durability=memory"
            ) from None
        except driver.AuthenticationError as error:
            raise JournalUnavailable(
                f"{operation}: redis {self.target.address} rejected the credentials ({error}); "
                "check the user and password in the URL"
            ) from None
        except (driver.ConnectionError, driver.TimeoutError) as error:
            raise JournalUnavailable(
                f"{operation}: redis {self.target.address} unreachable ({error}); check the server "
                "is running and reachable, then retry"
            ) from None
        except (driver.RedisError, driver.RedisClusterException) as error:
            raise JournalUnavailable(
                f"{operation}: redis {self.target.address} refused the command ({error})"
            ) from None

    def call(self, operation: str, *args: Any) -> Any:
        """Run one command (routed by its first key on a Cluster) and return the raw reply."""
        with self.errors(operation):
            return self._client.execute_command(*args)

    def raw_call(self, operation: str, *args: Any) -> Any:
        """Run one command and return its RESP2 reply unconverted (``HGETALL``: a flat list).

        The hot-path commands (snapshots, index reads, wake-ups) take the script path's idle
        connections on a standalone server.
        """
        with self.errors(operation):
            return self._client.execute_command(*args) if self.cluster else self._evalsha(*args)

    def script(self, operation: str, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a Lua script by SHA, loading it once and again after a ``NOSCRIPT`` reply."""
        sha = self._shas.get(source)
        if sha is None:
            sha = self._shas[source] = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        run: Callable[..., Any]
        if self.target.pipelined and _on_hub():
            run = partial(self._pipelined, keys[0] if keys else None)
        else:
            run = self._client.execute_command if self.cluster else self._evalsha
        with self.errors(operation):
            try:
                return run("EVALSHA", sha, len(keys), *keys, *args)
            except driver.NoScriptError:
                self._load(source, keys)
                return run("EVALSHA", sha, len(keys), *keys, *args)

    def scripts(
        self, operation: str, source: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run one script for each ``(keys, args)``; their replies, in order (the first error raises).

        On the hub with pipelining the calls to each node go out in one round
        trip; otherwise, and for any call answered with an error reply (a
        ``NOSCRIPT``, a redirection), each is sent as :meth:`script` sends it.
        """
        if not (self.target.pipelined and _on_hub()) or len(calls) < 2:
            return [self.script(operation, source, keys, args) for keys, args in calls]
        sha = self._shas.get(source)
        if sha is None:
            sha = self._shas[source] = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        groups: dict[str, list[int]] = {}
        connect: dict[str, Callable[[], Any]] = {}
        for index, (keys, _) in enumerate(calls):
            if not self.cluster:
                route, make = "", self._fresh
            else:
                node = self._client.nodes_manager.get_node_from_slot(self._client.keyslot(keys[0]))
                route, make = node.name, partial(self._fresh, node.redis_connection.connection_pool)
            groups.setdefault(route, []).append(index)
            connect[route] = make
        replies: list[Any] = [_UNSENT] * len(calls)
        with self.errors(operation):
            for route, indexes in groups.items():
                packed = [
                    _pack(["EVALSHA", sha, len(calls[i][0]), *calls[i][0], *calls[i][1]]) for i in indexes
                ]
                try:
                    answers = self._pipeline(route, connect[route]).call_many(packed)
                except (driver.ConnectionError, driver.TimeoutError):
                    answers = [None] * len(indexes)  # each sent again on its own below
                for i, answer in zip(indexes, answers, strict=True):
                    replies[i] = answer
        for i, reply in enumerate(replies):
            if isinstance(reply, driver.RedisError) or reply is _UNSENT:
                keys, args = calls[i]
                replies[i] = self.script(operation, source, keys, args)
        return replies

    def _pipeline(self, route: str, connect: Callable[[], Any]) -> Pipeline:
        pipelines: dict[str, Pipeline] | None = getattr(self._local, "pipelines", None)
        if pipelines is None:
            pipelines = self._local.pipelines = {}
        pipeline = pipelines.get(route)
        if pipeline is None:
            pipeline = pipelines[route] = Pipeline(connect)
            with self._pipelines_lock:
                self._pipelines.append(pipeline)
        return pipeline

    def _pipelined(self, key: str | None, *command: Any) -> Any:
        """Send one command in its server's pipeline (see :mod:`mayfly_redis._pipeline`)."""
        if not self.cluster:
            return self._pipeline("", self._fresh).call(_pack(command))
        if key is None:
            return self._client.execute_command(*command)
        client = self._client
        node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
        pool = node.redis_connection.connection_pool
        try:
            return self._pipeline(node.name, partial(self._fresh, pool)).call(_pack(command))
        except _REDIRECTED:
            # A slot that moved (or is moving), a node down: redis-py's own path follows the
            # redirection and refreshes the slot map. Safe to send again: see Pipeline.
            return client.execute_command(*command)

    def _evalsha(self, *command: Any) -> Any:
        """Send one command on an idle connection of the pool and read its reply (standalone)."""
        packed = [_pack(command)]
        idle = self._idle
        connection = idle.pop() if idle else self._fresh()
        try:
            connection.send_packed_command(packed, check_health=False)
            reply = connection.read_response()
        except (driver.ConnectionError, driver.TimeoutError):
            # One immediate retry on a new connection covers an idle one the server closed, as the
            # pooled path's Retry(NoBackoff(), 1) does; a script is safe to send again (an append that
            # was applied answers as an exact replay).
            connection.disconnect()
            connection = self._fresh()
            try:
                connection.send_packed_command(packed, check_health=False)
                reply = connection.read_response()
            except driver.ResponseError:
                idle.append(connection)
                raise
            except BaseException:
                connection.disconnect()
                raise
        except driver.ResponseError:
            idle.append(connection)
            raise
        except BaseException:
            connection.disconnect()
            raise
        idle.append(connection)
        return reply

    def _fresh(self, pool: Any = None) -> Any:
        # Built outside the pool's count: these are never handed back to it.
        pool = self._client.connection_pool if pool is None else pool
        connection = pool.connection_class(**pool.connection_kwargs)
        try:
            connection.connect()
        except BaseException:
            connection.disconnect()
            raise
        return connection

    def dedicated_connection(self) -> Any:
        """A new connection of its own (not pooled), connected, for a subscription.

        On a Cluster it is a connection to the first primary that answers
        (classic pub/sub messages reach every node). Call inside
        :meth:`errors`: connecting may raise redis-py errors.
        """
        if not self.cluster:
            return self._fresh()
        failure: BaseException | None = None
        for node in self._nodes():
            try:
                return self._fresh(node.connection_pool)
            except (driver.ConnectionError, driver.TimeoutError) as error:
                failure = error
        raise failure if failure is not None else driver.ConnectionError("no Cluster primary is known")

    def _load(self, source: str, keys: Sequence[str]) -> None:
        if self.cluster:
            # Load on every primary: the slot may move to any of them.
            for node in self._nodes():
                node.script_load(source)
        else:
            self._client.script_load(source)

    def close(self) -> None:
        """Close every pooled connection; later calls raise ``JournalUnavailable``."""
        if self._closed:
            return
        self._closed = True
        with suppress(driver.RedisError):  # closing a broken pool still leaves nothing open
            while self._idle:
                self._idle.pop().disconnect()
            with self._pipelines_lock:
                for pipeline in self._pipelines:
                    pipeline.close()
            self._client.close()


def open_store(url: str) -> RedisStore:
    """Parse ``url``, connect and verify durability; raise a typed error if any step fails."""
    return RedisStore(parse_url(url))


def relayed_store(target: RedisTarget, relay: Relay) -> RedisStore:
    """A store on ``target`` whose every connection, to each Cluster node too, dials ``relay(host, port)``."""
    return RedisStore(target.via(*relay(target.host, target.port)), relay=relay)
