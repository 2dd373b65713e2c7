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
import re
from typing import Final, final
from urllib.parse import parse_qsl, unquote, urlsplit

import msgspec

from mayfly.journal import redact_url
from mayfly.model.errors import InvalidBackendURL

__all__ = ["DEFAULT_PREFIX", "RedisDurability", "RedisTarget", "parse_url"]

SCHEMES: Final = ("redis", "rediss")
DEFAULT_PREFIX: Final = "mayfly"
DEFAULT_TIMEOUT_S: Final = 30.0
_MAX_DB: Final = 1 << 16
_MAX_TIMEOUT_S: Final = 3600.0
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTIONS: Final = frozenset({"prefix", "durability", "timeout", "ca_certs"})


class RedisDurability(enum.StrEnum):
    """What the URL asks the server to guarantee before an append is acknowledged."""

    AOF = "aof"
    """AOF with ``appendfsync always``: acknowledged records survive a server or host crash."""
    MEMORY = "memory"
    """No persistence is required: a server restart may lose acknowledged records."""


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
    if not isinstance(url, str):
        raise InvalidBackendURL(f"Redis backend URL must be a str, got {type(url).__name__}")
    control = _CONTROL.search(url)
    if control is not None:
        # urlsplit() silently deletes raw tab, CR and LF (bpo-43882): x\r\nFLUSHALL would open as
        # xFLUSHALL. A URL is refused, never rewritten.
        raise InvalidBackendURL(
            f"Redis URL {redact_url(url)!r} holds the control character {control.group()!r} at "
            f"position {control.start()}; remove it (prefix is 1-64 of A-Z a-z 0-9 _ . : -)"
        )
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as error:
        raise InvalidBackendURL(f"malformed Redis URL {shown}: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidBackendURL(f"expected a redis:// or rediss:// URL, got {shown}")
    host = parts.hostname or ""
    if not host:
        raise InvalidBackendURL(f"Redis URL {shown} names no host; use redis://HOST:PORT/DB")
    if parts.fragment:
        raise InvalidBackendURL(f"Redis URL {shown} has a fragment; remove '#{parts.fragment}'")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise InvalidBackendURL(f"Redis URL {shown}: database must be a number, got {path!r}")
    db = int(path) if path else 0
    if db >= _MAX_DB:
        raise InvalidBackendURL(f"Redis URL {shown}: database {db} is out of range")
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name not in _OPTIONS:
            known = ", ".join(sorted(_OPTIONS))
            raise InvalidBackendURL(f"Redis URL {shown}: unknown option {name!r} (known: {known})")
        if name in options:
            raise InvalidBackendURL(f"Redis URL {shown}: option {name!r} is given twice")
        options[name] = value
    prefix = options.get("prefix", DEFAULT_PREFIX)
    if _PREFIX.fullmatch(prefix) is None:
        raise InvalidBackendURL(
            f"Redis URL {shown}: prefix {prefix!r} must be 1-64 characters of A-Z a-z 0-9 _ . : -"
        )
    try:
        durability = RedisDurability(options.get("durability", RedisDurability.AOF))
    except ValueError:
        raise InvalidBackendURL(
            f"Redis URL {shown}: durability must be 'aof' (default) or 'memory', "
            f"got {options['durability']!r}"
        ) from None
    timeout = _timeout(shown, options.get("timeout"))
    ca_certs = options.get("ca_certs")
    if ca_certs is not None and (scheme != "rediss" or not ca_certs):
        raise InvalidBackendURL(f"Redis URL {shown}: ca_certs needs a rediss:// URL and a file path")
    return RedisTarget(
        url=shown,
        tls=scheme == "rediss",
        host=host,
        port=port,
        db=db,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        prefix=prefix,
        durability=durability,
        timeout_s=timeout,
        ca_certs=ca_certs,
    )


def _timeout(shown: str, text: str | None) -> float:
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= _MAX_TIMEOUT_S:
        raise InvalidBackendURL(
            f"Redis URL {shown}: timeout must be seconds in (0, {_MAX_TIMEOUT_S:g}], got {text!r}"
        )
    return value
