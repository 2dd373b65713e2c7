"""Mayfly on Redis: a journal and expiring recovery leases for ``redis://`` and ``rediss://`` URLs.

Install with ``pip install "mayfly-runtime[redis]"`` and open by URL::

    journal = mayfly.open_journal("redis://127.0.0.1:6379/0")      # durability=aof (default)
    leases = mayfly.open_leases("redis://127.0.0.1:6379/0")

``durability=aof`` refuses to open unless the server runs ``appendonly yes``
with ``appendfsync always``; ``?durability=memory`` accepts a non-persistent
server explicitly and reports it. Standalone servers and Redis Cluster are
both served. The journal keeps the run index and prompt wake-ups, so
``mayfly worker`` claims runs from it (see ``mayfly_redis._index``); a Cluster
store shards it over slots, every key of a run under its shard's hash tag
(``mayfly_redis._layout``), and offers no queue flow control.
"""

from mayfly_redis._connection import HubConnection, HubSocket, HubSSLConnection
from mayfly_redis._journal import RedisJournal
from mayfly_redis._lease import RedisLeaseGuard, RedisLeaseStore
from mayfly_redis._url import RedisDurability, RedisTarget, parse_url

__all__ = [
    "HubConnection",
    "HubSSLConnection",
    "HubSocket",
    "RedisDurability",
    "RedisJournal",
    "RedisLeaseGuard",
    "RedisLeaseStore",
    "RedisTarget",
    "parse_url",
]
