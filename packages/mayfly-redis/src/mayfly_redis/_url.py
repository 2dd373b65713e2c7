"""Redis backend URLs and the key layout they select.

``redis://[user[:password]@]host[:port][/db]?prefix=mayfly&durability=aof|memory&timeout=30``
(``&shards=16`` for a new Cluster store, ``&pipeline=off`` to send every append on its own;
``rediss://`` for TLS, which verifies the server's certificate and host name;
``ca_certs=PATH`` names the CA bundle when the system one does not apply).
Unknown options, a malformed prefix, a raw control character anywhere in the
URL or a database number out of range raise ``InvalidBackendURL`` and nothing
is opened: a URL is refused, never rewritten.

Key layout on a standalone server (``P`` is the prefix, ``R`` a run id; a
Cluster store shards its keys instead, see :mod:`mayfly_redis._layout`). Every
key of a run carries the hash tag ``{R}``, so one Lua script can check and
append atomically:

* ``P:{R}:records``  list, one element per record, in sequence order;
* ``P:{R}:ids``      hash, event id -> ``"<sequence> <checksum>"`` (dedup and replay);
* ``P:{R}:fence``    string, the newest fencing token granted for the run;
* ``P:{R}:lease``    string ``"<token> <nonce> <owner>"`` with a PX expiry;
* ``P:{R}:snapshot`` string, the run's snapshot (msgspec JSON);
* ``P:runs``         sorted set of run ids holding records (all scores 0, so
  ``ZRANGEBYLEX`` pages them in order without ``KEYS`` or ``SCAN``);
* ``P:{R}:index``    hash, the run's run-index entry, and the per-queue claim
  sets ``P:{q:Q}:...`` (see :mod:`mayfly_redis._index`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Annotated, Final, final

import msgspec

from mayfly.backend import BackendURL, parse_backend_url

__all__ = ["DEFAULT_PREFIX", "Pipelining", "RedisDurability", "RedisOptions", "RedisTarget", "parse_url"]

SCHEMES: Final = ("redis", "rediss")
DEFAULT_PREFIX: Final = "mayfly"
DEFAULT_TIMEOUT_S: Final = 30.0
_MAX_DB: Final = 1 << 16
_MAX_TIMEOUT_S: Final = 3600.0
_SHAPE: Final = "redis://[user[:password]@]host[:port][/db]?prefix=mayfly&durability=aof|memory&timeout=30"


class RedisDurability(enum.StrEnum):
    """What the URL asks the server to guarantee before an append is acknowledged."""

    AOF = "aof"
    """AOF with ``appendfsync always``: acknowledged records survive a server or host crash."""
    MEMORY = "memory"
    """No persistence is required: a server restart may lose acknowledged records."""


class Pipelining(enum.StrEnum):
    """Whether concurrent appends of one process share a round trip (``?pipeline=on|off``)."""

    ON = "on"
    """Appends waiting at the same time go out in one pipeline; each is acknowledged by its own reply."""
    OFF = "off"
    """Every append is its own round trip (for comparison)."""


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
    shards: (
        Annotated[int, msgspec.Meta(ge=1, le=1024, description="run-index shards of a new Cluster store")]
        | None
    ) = None
    pipeline: Annotated[Pipelining, msgspec.Meta(description="'on' (the default) or 'off'")] = Pipelining.ON


@final
@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis backend URL: where the server is and how keys and durability are set."""

    source: BackendURL[RedisOptions]
    """The parsed URL (its password stays out of ``repr``)."""
    db: int
    """The database number (``/db`` of the URL; always 0 on a Cluster)."""

    @property
    def url(self) -> str:
        """The URL with its password redacted."""
        return self.source.url

    @property
    def tls(self) -> bool:
        """Whether the URL is ``rediss://`` (TLS, the server's certificate and host name verified)."""
        return self.source.scheme == "rediss"

    @property
    def host(self) -> str:
        """The server's host."""
        return self.source.host or ""

    @property
    def port(self) -> int:
        """The server's port (6379 unless given)."""
        return self.source.port or 6379

    @property
    def username(self) -> str | None:
        """The ACL user, if the URL names one."""
        return self.source.username

    @property
    def password(self) -> str | None:
        """The password, if the URL gives one (never shown in messages)."""
        return self.source.password

    @property
    def prefix(self) -> str:
        """The key prefix of every key this backend writes."""
        return self.source.options.prefix

    @property
    def durability(self) -> RedisDurability:
        """What the server must guarantee before an append is acknowledged."""
        return self.source.options.durability

    @property
    def timeout_s(self) -> float:
        """The bound of every connect and reply, in seconds."""
        return self.source.options.timeout

    @property
    def ca_certs(self) -> str | None:
        """The CA bundle to verify a TLS server with, if not the system's."""
        return self.source.options.ca_certs

    @property
    def shards(self) -> int | None:
        """The run-index shards the URL asks of a Cluster store (``None``: the store's, or the default)."""
        return self.source.options.shards

    @property
    def pipelined(self) -> bool:
        """Whether concurrent appends share round trips (``pipeline=on``, the default)."""
        return self.source.options.pipeline is Pipelining.ON

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

    def via(self, host: str, port: int) -> RedisTarget:
        """The same target reached at another address (a relay in front of the server)."""
        return RedisTarget(dataclasses.replace(self.source, host=host, port=port), self.db)


def parse_url(url: str) -> RedisTarget:
    """Parse a ``redis://`` or ``rediss://`` backend URL; raise ``InvalidBackendURL`` if it is bad."""
    parsed = parse_backend_url(url, RedisOptions, _SHAPE, kind="server", schemes=SCHEMES, label="Redis")
    path = parsed.location.strip("/")
    if path and not path.isdigit():
        raise parsed.invalid(f"the database must be a number, got {path!r}")
    db = int(path) if path else 0
    if db >= _MAX_DB:
        raise parsed.invalid(f"database {db} is out of range")
    if parsed.options.ca_certs is not None and (parsed.scheme != "rediss" or not parsed.options.ca_certs):
        raise parsed.invalid("ca_certs needs a rediss:// URL and a file path")
    return RedisTarget(parsed, db)
