"""The ``redis://`` and ``rediss://`` backends, published through the ``mayfly`` entry-point group."""

from __future__ import annotations

from typing import Final

from mayfly.backend import backend_hooks
from mayfly_redis._journal import RedisJournal
from mayfly_redis._lease import RedisLeaseStore
from mayfly_redis._url import SCHEMES, RedisDurability, parse_url

MAYFLY_PLUGIN_API = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-redis"
_SUMMARY: Final = (
    "Redis journal and expiring leases (standalone or Cluster); durability aof "
    "(appendfsync always, verified at open: durable) or memory (explicit, not durable)"
)


def describe(url: str) -> str:
    """One line for ``mayfly backends``: what the Redis journal at ``url`` guarantees (no connection made)."""
    if url.split("://", 1)[-1] in ("", "/"):
        return _SUMMARY
    target = parse_url(url)
    if target.durability is RedisDurability.AOF:
        guarantee = "durability aof: durable (appendonly yes + appendfsync always verified at open)"
    else:
        guarantee = "durability memory: NOT durable, a server restart may lose acknowledged records"
    tls = ", TLS" if target.tls else ""
    return f"Redis journal at {target.address}{tls}, key prefix {target.prefix!r}, {guarantee}"


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    SCHEMES, DISTRIBUTION, RedisJournal, RedisLeaseStore, describe=describe, summary=_SUMMARY
)
