"""Parsing ``postgresql://`` URLs: Mayfly's options are split off, the rest goes to libpq unchanged."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Final, Literal, final
from urllib.parse import quote, urlencode, urlunsplit

import msgspec

from mayfly.backend import BackendURL, parse_backend_url
from mayfly.journal import Durability

__all__ = ["SCHEMES", "PostgresOptions", "PostgresSettings", "parse_url"]

SCHEMES: Final = ("postgresql", "postgres")
"""URL schemes served by this backend (libpq accepts both)."""

# PostgreSQL's own schemas: Mayfly's tables inside one of them would mix with the catalog.
_SYSTEM_SCHEMA = re.compile(r"information_schema|pg_.*")
_DURABILITY: Final = {"durable": Durability.DURABLE, "write": Durability.WRITE}
_MAX_POOL: Final = 1000
_MAX_RECONNECT_S: Final = 3600.0
_SHAPE: Final = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE?schema=mayfly&durability=durable"


class PostgresOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Mayfly's options in a ``postgresql://`` URL; every other query parameter goes to libpq."""

    schema: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^[a-z_][a-z0-9_]{0,62}$",
            description="a lowercase identifier (a-z, 0-9, _) not starting pg_",
        ),
    ] = "mayfly"
    durability: Literal["durable", "write"] = "durable"
    migrate: Literal["auto", "never"] = "auto"
    pool_size: Annotated[
        int, msgspec.Meta(ge=1, le=_MAX_POOL, description=f"a whole number in [1, {_MAX_POOL}]")
    ] = 8
    reconnect_timeout: Annotated[
        float, msgspec.Meta(ge=0, le=_MAX_RECONNECT_S, description=f"seconds in [0, {_MAX_RECONNECT_S:g}]")
    ] = 15.0


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

    source: BackendURL[PostgresOptions] | None = field(default=None, repr=False, compare=False)
    """The parsed URL, for reopening the same store through another address (the contract suite's relay)."""

    @property
    def synchronous_commit(self) -> str:
        """The ``synchronous_commit`` setting every connection runs with."""
        return "on" if self.durability is Durability.DURABLE else "off"

    @property
    def startup_options(self) -> str:
        """The URL's ``options`` followed by Mayfly's own setting, which wins over any earlier one."""
        own = f"-c synchronous_commit={self.synchronous_commit}"
        return f"{self.options} {own}" if self.options else own


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
    parsed = parse_backend_url(
        url,
        PostgresOptions,
        _SHAPE,
        kind="server",
        schemes=SCHEMES,
        label="PostgreSQL",
        host_required=False,
        passthrough=True,
    )
    options = parsed.options
    if _SYSTEM_SCHEMA.fullmatch(options.schema) is not None:
        raise parsed.invalid(
            f"schema={options.schema!r} is a PostgreSQL system schema; name a schema of Mayfly's own "
            "(such as schema=mayfly), never information_schema or pg_*"
        )
    # libpq's options parameter is rebuilt per connection, with Mayfly's durability setting last.
    user_options = " ".join(value for name, value in parsed.extra if name == "options")
    libpq = [(name, value) for name, value in parsed.extra if name != "options"]
    if not any(name == "application_name" for name, _ in libpq):
        libpq.append(("application_name", "mayfly"))
    conninfo = urlunsplit(
        ("postgresql", parsed.netloc, parsed.location, urlencode(libpq, quote_via=quote), "")
    )
    return PostgresSettings(
        url=parsed.url,
        conninfo=conninfo,
        schema=options.schema,
        durability=_DURABILITY[options.durability],
        migrate=options.migrate,
        pool_size=options.pool_size,
        reconnect_timeout=options.reconnect_timeout,
        options=user_options,
        source=parsed,
    )
