"""The ``redis://`` and ``rediss://`` backends, published through the ``mayfly`` entry-point group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mayfly.hookspecs import BackendDescriptor, hookimpl
from mayfly_redis._journal import RedisJournal
from mayfly_redis._lease import RedisLeaseStore
from mayfly_redis._url import SCHEMES, RedisDurability, parse_url

MAYFLY_PLUGIN_API = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-redis"


def describe(url: str) -> str:
    """One line for ``mayfly backends``: what the Redis journal at ``url`` guarantees (no connection made)."""
    if url.split("://", 1)[-1] in ("", "/"):
        return (
            "Redis journal and expiring leases (standalone or Cluster); durability aof "
            "(appendfsync always, verified at open: durable) or memory (explicit, not durable)"
        )
    target = parse_url(url)
    if target.durability is RedisDurability.AOF:
        guarantee = "durability aof: durable (appendonly yes + appendfsync always verified at open)"
    else:
        guarantee = "durability memory: NOT durable, a server restart may lose acknowledged records"
    tls = ", TLS" if target.tls else ""
    return f"Redis journal at {target.address}{tls}, key prefix {target.prefix!r}, {guarantee}"


@hookimpl
def mayfly_journal_backends() -> Sequence[BackendDescriptor]:
    """Offer the Redis journal for ``redis://`` and ``rediss://`` URLs."""
    return [BackendDescriptor(SCHEMES, DISTRIBUTION, RedisJournal, describe)]


@hookimpl
def mayfly_lease_backends() -> Sequence[BackendDescriptor]:
    """Offer Redis recovery leases for ``redis://`` and ``rediss://`` URLs."""
    return [BackendDescriptor(SCHEMES, DISTRIBUTION, RedisLeaseStore, describe)]
