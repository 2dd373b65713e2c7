"""PostgreSQL journal and recovery leases for Mayfly: many runtime processes on many hosts share runs.

Install with ``pip install "mayfly-runtime[postgres]"`` and open ``postgresql://`` URLs
anywhere Mayfly takes a journal URL::

    postgresql://mayfly@db.internal:5432/app?schema=mayfly&durability=durable

The module is the plugin published in the ``mayfly`` entry-point group: it
declares :data:`MAYFLY_PLUGIN_API` and offers the ``postgresql`` (and
``postgres``) scheme for journals and leases. The schema is migrated on first
open (``?migrate=never`` refuses DDL; run ``python -m mayfly_postgres migrate
URL`` instead).
"""

from __future__ import annotations

from typing import Final

import psycopg

from mayfly.backend import backend_hooks
from mayfly.errors import JournalUnavailable
from mayfly.journal import RunSummary
from mayfly_postgres._journal import PostgresJournal
from mayfly_postgres._lease import PostgresLeaseGuard, PostgresLeaseStore
from mayfly_postgres._schema import LATEST_VERSION, applied_version
from mayfly_postgres._url import SCHEMES, PostgresSettings, parse_url

__all__ = [
    "LATEST_VERSION",
    "MAYFLY_PLUGIN_API",
    "PostgresJournal",
    "PostgresLeaseGuard",
    "PostgresLeaseStore",
    "PostgresSettings",
    "RunSummary",
    "parse_url",
]

MAYFLY_PLUGIN_API = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-postgres"


def _describe(url: str) -> str:
    """One line for ``mayfly backends``: what the journal at ``url`` guarantees."""
    settings = parse_url(url)
    return (
        f"PostgreSQL journal at {settings.url}, schema {settings.schema}, durability "
        f"{settings.durability} (synchronous_commit={settings.synchronous_commit}), expiring fenced leases"
    )


def _exists(url: str) -> bool:
    """Whether a Mayfly store is at ``url``: its schema holds applied migrations (nothing is created)."""
    settings = parse_url(url)
    try:
        with psycopg.connect(settings.conninfo, connect_timeout=10) as connection:
            return applied_version(connection, settings.schema) > 0
    except psycopg.Error as exc:
        raise JournalUnavailable(
            f"cannot reach PostgreSQL at {settings.url}: {str(exc).strip().splitlines()[0]}"
        ) from None


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    SCHEMES,
    DISTRIBUTION,
    PostgresJournal,
    PostgresLeaseStore,
    describe=_describe,
    exists=_exists,
    summary=(
        "PostgreSQL journal and expiring fenced leases across hosts "
        "(durability durable: synchronous_commit=on | write: off)"
    ),
)
