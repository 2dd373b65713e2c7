"""Parsing ``postgresql://`` URLs: Mayfly's options are split off, the rest goes to libpq unchanged."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from mayfly.journal import Durability, redact_url
from mayfly.model.errors import InvalidBackendURL

__all__ = ["SCHEMES", "PostgresSettings", "parse_url"]

SCHEMES: Final = ("postgresql", "postgres")
"""URL schemes served by this backend (libpq accepts both)."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# PostgreSQL's own schemas: Mayfly's tables inside one of them would mix with the catalog.
_SYSTEM_SCHEMA = re.compile(r"information_schema|pg_.*")
# urlsplit() silently deletes raw tab, CR and LF (bpo-43882), so the URL is checked before it.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DURABILITY: Final = {"durable": Durability.DURABLE, "write": Durability.WRITE}
_MIGRATE: Final = ("auto", "never")
_MAX_POOL: Final = 1000
_MAX_RECONNECT_S: Final = 3600.0
# Options Mayfly reads; every other query parameter is a libpq connection parameter.
_MAYFLY_OPTIONS: Final = frozenset({"schema", "durability", "migrate", "pool_size", "reconnect_timeout"})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresSettings:
    """What a ``postgresql://`` URL asks for, split into Mayfly options and the libpq conninfo.

    ``conninfo`` keeps the password (it is handed to libpq only); ``url`` is
    the redacted form safe for messages and logs.
    """

    url: str
    conninfo: str
    schema: str
    durability: Durability
    migrate: str
    pool_size: int
    reconnect_timeout: float

    options: str = ""
    """The libpq ``options`` the URL gave (server settings for every connection), if any."""

    @property
    def synchronous_commit(self) -> str:
        """The ``synchronous_commit`` setting every connection runs with."""
        return "on" if self.durability is Durability.DURABLE else "off"

    @property
    def startup_options(self) -> str:
        """The URL's ``options`` followed by Mayfly's own setting, which wins over any earlier one."""
        own = f"-c synchronous_commit={self.synchronous_commit}"
        return f"{self.options} {own}" if self.options else own


def _fail(url: str, problem: str) -> InvalidBackendURL:
    return InvalidBackendURL(
        f"invalid PostgreSQL URL {redact_url(url)!r}: {problem}; expected "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE?schema=mayfly&durability=durable"
    )


def _number(url: str, name: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(url, f"{name}={text!r} is not a number") from None
    if not low <= value <= high:
        raise _fail(url, f"{name}={text} must be in [{low:g}, {high:g}]")
    return value


def parse_url(url: object) -> PostgresSettings:
    """Split ``url`` into :class:`PostgresSettings`, or raise ``InvalidBackendURL`` naming the problem.

    Mayfly options: ``schema`` (default ``mayfly``; lowercase SQL identifier,
    never a system schema: ``information_schema`` and ``pg_*`` are refused),
    ``durability`` (``durable``: ``synchronous_commit=on``, the default;
    ``write``: ``synchronous_commit=off``), ``migrate`` (``auto`` applies
    pending migrations on open, ``never`` refuses to run DDL), ``pool_size``
    (connections per thread, default 8) and ``reconnect_timeout`` (seconds to
    keep retrying a lost server, default 15). Anything else, such as
    ``sslmode`` or ``connect_timeout``, is passed to libpq as it is. A raw
    control character anywhere in the URL is refused, not stripped.
    """
    if not isinstance(url, str):
        raise InvalidBackendURL(f"PostgreSQL URL must be a string, got {type(url).__name__}")
    control = _CONTROL.search(url)
    if control is not None:
        raise _fail(
            url,
            f"it holds the control character {control.group()!r} at position {control.start()}; "
            "remove it (a URL is never rewritten to drop one)",
        )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError as error:
        raise _fail(url, str(error)) from None
    if parts.scheme not in SCHEMES:
        raise _fail(url, f"scheme {parts.scheme!r} is not postgresql")
    if parts.fragment:
        raise _fail(url, "a fragment (#...) has no meaning here")
    options: dict[str, str] = {}
    libpq: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name in _MAYFLY_OPTIONS:
            if name in options:
                raise _fail(url, f"option {name} is given twice")
            options[name] = value
        else:
            libpq.append((name, value))
    schema = options.get("schema", "mayfly")
    if _SYSTEM_SCHEMA.fullmatch(schema) is not None:
        raise _fail(
            url,
            f"schema={schema!r} is a PostgreSQL system schema; name a schema of Mayfly's own "
            "(such as schema=mayfly), never information_schema or pg_*",
        )
    if _SCHEMA_NAME.fullmatch(schema) is None:
        raise _fail(url, f"schema={schema!r} must be a lowercase identifier (a-z, 0-9, _) not starting pg_")
    durability_name = options.get("durability", "durable")
    if durability_name not in _DURABILITY:
        raise _fail(url, f"durability={durability_name!r} must be one of {', '.join(_DURABILITY)}")
    migrate = options.get("migrate", "auto")
    if migrate not in _MIGRATE:
        raise _fail(url, f"migrate={migrate!r} must be one of {', '.join(_MIGRATE)}")
    pool = _number(url, "pool_size", options.get("pool_size", "8"), 1, _MAX_POOL)
    if pool != int(pool):
        raise _fail(url, f"pool_size={options['pool_size']} must be a whole number")
    reconnect = _number(url, "reconnect_timeout", options.get("reconnect_timeout", "15"), 0, _MAX_RECONNECT_S)
    # libpq's options parameter is rebuilt per connection, with Mayfly's durability setting last.
    user_options = " ".join(value for name, value in libpq if name == "options")
    libpq = [(name, value) for name, value in libpq if name != "options"]
    if not any(name == "application_name" for name, _ in libpq):
        libpq.append(("application_name", "mayfly"))
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(libpq, quote_via=quote), ""))
    return PostgresSettings(
        url=redact_url(url),
        conninfo=conninfo,
        schema=schema,
        durability=_DURABILITY[durability_name],
        migrate=migrate,
        pool_size=int(pool),
        reconnect_timeout=reconnect,
        options=user_options,
    )
