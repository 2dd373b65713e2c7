"""Redis backend URLs and the key layout they select.

``redis://[user[:password]@]host[:port][/db]?prefix=mayfly&durability=aof|memory&timeout=30``
(``rediss://`` for TLS, which verifies the server's certificate and host name;
``ca_certs=PATH`` names the CA bundle when the system one does not apply).
Unknown options, a malformed prefix, a raw control character anywhere in the
URL or a database number out of range raise ``InvalidBackendURL`` and nothing
is opened: a URL is refused, never rewritten.

Key layout (``P`` is the prefix, ``R`` a run id). Every key of a run carries the
hash tag ``{R}``, so a run lives in one Redis Cluster slot and one Lua script
can check and append atomically:

* ``P:{R}:records``  list, one element per record, in sequence order;
* ``P:{R}:ids``      hash, event id -> ``"<sequence> <checksum>"`` (dedup and replay);
* ``P:{R}:fence``    string, the newest fencing token granted for the run;
* ``P:{R}:lease``    string ``"<token> <nonce> <owner>"`` with a PX expiry;
* ``P:{R}:snapshot`` string, the run's snapshot (msgspec JSON);
* ``P:runs``         sorted set of run ids holding records (all scores 0, so
  ``ZRANGEBYLEX`` pages them in order without ``KEYS`` or ``SCAN``).
"""

from __future__ import annotations

import enum
from typing import Annotated, Final, final

import msgspec

from mayfly.backend import parse_backend_url

__all__ = ["DEFAULT_PREFIX", "RedisDurability", "RedisOptions", "RedisTarget", "parse_url"]

SCHEMES: Final = ("redis", "rediss")
DEFAULT_PREFIX: Final = "mayfly"
DEFAULT_TIMEOUT_S: Final = 30.0
_MAX_DB: Final = 1 << 16
_MAX_TIMEOUT_S: Final = 3600.0


class RedisDurability(enum.StrEnum):
    """What the URL asks the server to guarantee before an append is acknowledged."""

    AOF = "aof"
    """AOF with ``appendfsync always``: acknowledged records survive a server or host crash."""
    MEMORY = "memory"
    """No persistence is required: a server restart may lose acknowledged records."""


class RedisOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of a ``redis://`` or ``rediss://`` URL."""

    prefix: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="1-64 characters of A-Z a-z 0-9 _ . : -"
        ),
    ] = DEFAULT_PREFIX
    durability: Annotated[RedisDurability, msgspec.Meta(description="'aof' (the default) or 'memory'")] = (
        RedisDurability.AOF
    )
    timeout: Annotated[
        float, msgspec.Meta(gt=0, le=_MAX_TIMEOUT_S, description=f"seconds in (0, {_MAX_TIMEOUT_S:g}]")
    ] = DEFAULT_TIMEOUT_S
    ca_certs: str | None = None


@final
class RedisTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed Redis backend URL: where the server is and how keys and durability are set."""

    url: str
    tls: bool
    host: str
    port: int
    db: int
    username: str | None
    password: str | None = msgspec.field(default=None)
    prefix: str
    durability: RedisDurability
    timeout_s: float
    ca_certs: str | None = None

    @property
    def address(self) -> str:
        """``host:port/db``, for messages."""
        return f"{self.host}:{self.port}/{self.db}"

    def key(self, run_id: str, name: str) -> str:
        """Return the key ``name`` of ``run_id`` (hash-tagged by the run id)."""
        return f"{self.prefix}:{{{run_id}}}:{name}"

    @property
    def runs_key(self) -> str:
        """The sorted set indexing run ids that hold records."""
        return f"{self.prefix}:runs"


def parse_url(url: str) -> RedisTarget:
    """Parse a ``redis://`` or ``rediss://`` backend URL; raise ``InvalidBackendURL`` if it is bad."""
    parsed = parse_backend_url(
        url,
        RedisOptions,
        schemes=SCHEMES,
        label="Redis",
        shape="redis://[user[:password]@]host[:port][/db]?prefix=mayfly&durability=aof|memory&timeout=30",
        kind="server",
    )
    path = parsed.location.strip("/")
    if path and not path.isdigit():
        raise parsed.invalid(f"the database must be a number, got {path!r}")
    db = int(path) if path else 0
    if db >= _MAX_DB:
        raise parsed.invalid(f"database {db} is out of range")
    options = parsed.options
    tls = parsed.scheme == "rediss"
    if options.ca_certs is not None and (not tls or not options.ca_certs):
        raise parsed.invalid("ca_certs needs a rediss:// URL and a file path")
    assert parsed.host is not None  # host_required
    return RedisTarget(
        url=parsed.url,
        tls=tls,
        host=parsed.host,
        port=parsed.port or 6379,
        db=db,
        username=parsed.username,
        password=parsed.password,
        prefix=options.prefix,
        durability=options.durability,
        timeout_s=options.timeout,
        ca_certs=options.ca_certs,
    )
