"""Versioned schema migrations, applied under an advisory lock; every identifier quoted by ``psycopg.sql``.

Tables (all inside the configured schema):

``mayfly_migrations``  one row per applied migration version.
``runs``               per run: next sequence, fencing token, and inspection
                       columns (workflow id, status, created/updated time).
``records``            the journal: primary key (run id, sequence), unique
                       (run id, event id), payload as ``bytea``, checksum.
``snapshots``          at most one snapshot per run.
``leases``             per run: owner, fencing token, expiry on the server's
                       clock, and the grant's id (to resolve lost replies).
``run_index``          (migration 2) per run: the run index entry
                       (:mod:`mayfly.runindex`) workers claim runs from.
                       Derived data: a store upgraded from migration 1 has
                       no entries for its older runs until ``mayfly index
                       rebuild`` writes them from the histories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from mayfly.errors import CompatibilityError, JournalUnavailable
from mayfly_postgres._url import PostgresSettings

__all__ = ["LATEST_VERSION", "MIGRATIONS", "applied_version", "drop_schema", "ensure_schema", "migrate"]

# Each migration is a list of statements; {schema} is replaced by the quoted schema name.
MIGRATIONS: Final[Sequence[tuple[int, str, Sequence[str]]]] = (
    (
        1,
        "journal, snapshots, leases and run inspection columns",
        (
            """CREATE TABLE {schema}.runs (
                run_id uuid PRIMARY KEY,
                next_sequence bigint NOT NULL DEFAULT 1 CHECK (next_sequence >= 1),
                fence bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
                workflow_id text,
                status text,
                created_at timestamptz NOT NULL DEFAULT now(),
                updated_at timestamptz NOT NULL DEFAULT now()
            ) WITH (fillfactor = 70)""",
            """CREATE TABLE {schema}.records (
                run_id uuid NOT NULL,
                sequence bigint NOT NULL CHECK (sequence >= 1),
                event_id uuid NOT NULL,
                event_type text NOT NULL,
                schema_version bigint NOT NULL CHECK (schema_version >= 1),
                payload bytea NOT NULL,
                checksum text NOT NULL,
                PRIMARY KEY (run_id, sequence),
                UNIQUE (run_id, event_id)
            )""",
            """CREATE TABLE {schema}.snapshots (
                run_id uuid PRIMARY KEY,
                schema_version bigint NOT NULL,
                last_sequence bigint NOT NULL,
                last_event_id uuid NOT NULL,
                last_record_checksum text NOT NULL,
                spec_checksum text NOT NULL,
                state_checksum text NOT NULL,
                state bytea NOT NULL,
                checksum text NOT NULL,
                written_at timestamptz NOT NULL DEFAULT now()
            )""",
            """CREATE TABLE {schema}.leases (
                run_id uuid PRIMARY KEY,
                owner text NOT NULL,
                token bigint NOT NULL CHECK (token >= 1),
                grant_id uuid NOT NULL,
                expires_at timestamptz NOT NULL
            )""",
            "CREATE INDEX runs_status_updated ON {schema}.runs (status, updated_at DESC, run_id)",
            "CREATE INDEX runs_workflow_updated ON {schema}.runs (workflow_id, updated_at DESC, run_id)",
            "CREATE INDEX runs_updated ON {schema}.runs (updated_at DESC, run_id)",
        ),
    ),
    (
        2,
        "run index: per-run claim entries (status, wake time, wake flag, queue, parent, priority)",
        (
            """CREATE TABLE {schema}.run_index (
                run_id uuid PRIMARY KEY,
                queue text NOT NULL,
                status text NOT NULL CHECK (status IN ('new', 'running', 'waiting', 'terminal')),
                ready_at bigint,
                sequence bigint NOT NULL CHECK (sequence >= 0),
                wake boolean NOT NULL DEFAULT false,
                parent uuid,
                priority bigint NOT NULL DEFAULT 0
            ) WITH (fillfactor = 70)""",
            # The claim order over the entries that can ever be claimed: a root run that is runnable,
            # has a wake time, or was woken. Runs parked on a signal only enter it when woken.
            """CREATE INDEX run_index_claim ON {schema}.run_index (priority DESC, ready_at, run_id)
                WHERE parent IS NULL AND (status IN ('new', 'running')
                    OR (status = 'waiting' AND (ready_at IS NOT NULL OR wake)))""",
            """CREATE INDEX run_index_wake ON {schema}.run_index (ready_at)
                WHERE parent IS NULL AND status = 'waiting'""",
            # The few woken runs, so a claim clears their wake without scanning the table.
            "CREATE INDEX run_index_woken ON {schema}.run_index (run_id) WHERE wake",
        ),
    ),
)
"""Every migration in order: (version, description, statements). Append only; never edit a released one."""

LATEST_VERSION: Final = MIGRATIONS[-1][0]
"""The schema version this distribution reads and writes."""


def _lock_key(schema: str) -> sql.Composed:
    # One advisory lock per schema: deployments sharing a database migrate independently.
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
        sql.Literal(f"mayfly-postgres:{schema}")
    )


def _statement(template: str, schema: str) -> sql.Composed:
    return sql.SQL(template).format(schema=sql.Identifier(schema))


def applied_version(connection: psycopg.Connection[tuple[Any, ...]], schema: str) -> int:
    """Return the highest applied migration of ``schema`` (0 when it holds no Mayfly tables)."""
    row = connection.execute(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_tables "
        "WHERE schemaname = %s AND tablename = 'mayfly_migrations')",
        (schema,),
    ).fetchone()
    if row is None or not row[0]:
        return 0
    version = connection.execute(
        _statement("SELECT COALESCE(max(version), 0) FROM {schema}.mayfly_migrations", schema)
    ).fetchone()
    return int(version[0]) if version else 0


def migrate(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> list[int]:
    """Apply every pending migration in one transaction under the schema's advisory lock.

    Returns the versions applied (empty when the schema was current). Safe to
    run from many processes at once: one applies, the others wait and find
    nothing to do.
    """
    schema = settings.schema
    applied: list[int] = []
    with connection.transaction():
        connection.execute(_lock_key(schema))
        connection.execute(_statement("CREATE SCHEMA IF NOT EXISTS {schema}", schema))
        connection.execute(
            _statement(
                "CREATE TABLE IF NOT EXISTS {schema}.mayfly_migrations ("
                "version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())",
                schema,
            )
        )
        current = applied_version(connection, schema)
        _check_not_newer(settings, current)
        for version, description, statements in MIGRATIONS:
            if version <= current:
                continue
            for template in statements:
                connection.execute(_statement(template, schema))
            connection.execute(
                _statement(
                    "INSERT INTO {schema}.mayfly_migrations (version, description) VALUES (%s, %s)", schema
                ),
                (version, description),
            )
            applied.append(version)
    return applied


def _check_not_newer(settings: PostgresSettings, current: int) -> None:
    if current > LATEST_VERSION:
        raise CompatibilityError(
            f"{settings.url}: schema {settings.schema} is at migration {current}, newer than the "
            f"{LATEST_VERSION} this mayfly-postgres knows; upgrade mayfly-postgres on this host"
        )


def ensure_schema(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> None:
    """Make sure the schema is current: migrate when ``migrate=auto``, else refuse a stale one."""
    current = applied_version(connection, settings.schema)
    _check_not_newer(settings, current)
    if current == LATEST_VERSION:
        return
    if settings.migrate == "never":
        raise JournalUnavailable(
            f"{settings.url}: schema {settings.schema} is at migration {current}, this mayfly-postgres "
            f"needs {LATEST_VERSION}; run `python -m mayfly_postgres migrate URL` as a role allowed DDL"
        )
    migrate(connection, settings)


def drop_schema(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> None:
    """Drop the schema and everything in it (tests and teardown; irreversible)."""
    with connection.transaction():
        connection.execute(_lock_key(settings.schema))
        connection.execute(_statement("DROP SCHEMA IF EXISTS {schema} CASCADE", settings.schema))
