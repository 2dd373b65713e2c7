"""Migrations: applied once under an advisory lock, refused when forbidden, quoted identifiers, newer schemas, system schemas."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgserver import IDS, batch, drop_schema, fresh_schema, with_options

from mayfly.model.errors import CompatibilityError, InvalidBackendURL, JournalUnavailable
from mayfly_postgres import LATEST_VERSION, PostgresJournal, PostgresLeaseStore
from mayfly_postgres._schema import MIGRATIONS, applied_version, migrate
from mayfly_postgres._url import parse_url


@pytest.fixture
def new_schema(server: str) -> Iterator[str]:
    """A schema name nobody created yet; dropped after the test."""
    name = fresh_schema()
    yield name
    drop_schema(server, name)


def test_first_open_migrates_once(server: str, new_schema: str) -> None:
    """Opening a journal on an empty schema creates it at the latest version; reopening applies nothing."""
    url = with_options(server, schema=new_schema)
    with PostgresJournal(url):
        pass
    with psycopg.connect(server, autocommit=True) as connection:
        assert applied_version(connection, new_schema) == LATEST_VERSION
        assert migrate(connection, parse_url(url)) == []
        rows = connection.execute(
            psycopg.sql.SQL("SELECT version FROM {}").format(
                psycopg.sql.Identifier(new_schema, "mayfly_migrations")
            )
        ).fetchall()
    assert rows == [(version,) for version in range(1, LATEST_VERSION + 1)]


def test_racing_migrations_apply_exactly_once(server: str, new_schema: str) -> None:
    """Four processes migrating one schema at once: one applies each version, the others find it current."""
    url = with_options(server, schema=new_schema)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "mayfly_postgres", "migrate", url], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=60)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * 4
    assert sum("applied 1" in output for output in outputs) == 1
    assert sum("nothing (already current)" in output for output in outputs) == 3


def test_a_schema_at_migration_2_applies_migrations_3_and_4(server: str, new_schema: str) -> None:
    """migrate() on a schema at version 2 applies 3 and 4: the queues table, the claim function, schedules."""
    url = with_options(server, schema=new_schema)
    name = psycopg.sql.Identifier(new_schema)
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(name))
        connection.execute(
            psycopg.sql.SQL(
                "CREATE TABLE {}.mayfly_migrations (version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(name)
        )
        for version, description, statements in MIGRATIONS[:2]:
            for template in statements:
                connection.execute(psycopg.sql.SQL(template).format(schema=name))
            connection.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {}.mayfly_migrations (version, description) VALUES (%s, %s)"
                ).format(name),
                (version, description),
            )
        assert migrate(connection, parse_url(url)) == [3, 4]
        assert applied_version(connection, new_schema) == 4
        found = connection.execute(
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL, "
            "to_regprocedure(%s) IS NOT NULL",
            (
                f"{new_schema}.queues",
                f"{new_schema}.schedules",
                f"{new_schema}.mayfly_claim(text,bigint,float8,bigint,text[],text[],bigint[])",
            ),
        ).fetchone()
        assert found == (True, True)
        indexes = {
            str(row[0])
            for row in connection.execute(
                "SELECT indexname FROM pg_catalog.pg_indexes WHERE schemaname = %s", (new_schema,)
            )
        }
        # The claim's searches replace migration 2's run_index_claim (see CLAIM_FUNCTION).
        assert "run_index_claim" not in indexes
        assert {
            "run_index_runnable",
            "run_index_queue_runnable",
            "run_index_wake",
            "run_index_woken",
            "leases_expiry",
        } <= indexes


def test_migrate_never_refuses_a_stale_schema(server: str, new_schema: str) -> None:
    """With migrate=never an unmigrated schema is refused with the command to run; nothing is created."""
    url = with_options(server, schema=new_schema, migrate="never")
    with pytest.raises(JournalUnavailable, match="python -m mayfly_postgres migrate"):
        PostgresJournal(url)
    with psycopg.connect(server, autocommit=True) as connection:
        assert applied_version(connection, new_schema) == 0
        migrate(connection, parse_url(url))
    with PostgresJournal(url) as journal:
        run = IDS.new_id()
        journal.append(run, 1, batch(run, 1))


def test_a_newer_schema_is_refused(server: str, new_schema: str) -> None:
    """A schema migrated by a newer mayfly-postgres raises CompatibilityError instead of being used."""
    url = with_options(server, schema=new_schema)
    with psycopg.connect(server, autocommit=True) as connection:
        migrate(connection, parse_url(url))
        connection.execute(
            psycopg.sql.SQL("INSERT INTO {} (version, description) VALUES (%s, 'from the future')").format(
                psycopg.sql.Identifier(new_schema, "mayfly_migrations")
            ),
            (LATEST_VERSION + 1,),
        )
    with pytest.raises(CompatibilityError, match="upgrade mayfly-postgres"):
        PostgresJournal(url)


@pytest.mark.parametrize("reserved", ["user", "order", "select"])
def test_reserved_word_schema_names_are_quoted(server: str, reserved: str) -> None:
    """Schema names that are SQL keywords work, because every identifier is quoted."""
    name = f"{reserved}"
    drop_schema(server, name)
    try:
        with PostgresJournal(with_options(server, schema=name)) as journal:
            run = IDS.new_id()
            journal.append(run, 1, batch(run, 1))
            assert journal.list_runs() == [run]
    finally:
        drop_schema(server, name)


def _mayfly_tables(connection: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = connection.execute(
        "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = ANY(%s)",
        (schema, ["mayfly_migrations", "runs", "records", "snapshots", "leases"]),
    ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "pg_toast", "pg_mayfly"])
def test_system_schemas_are_refused_and_nothing_is_created(server: str, schema: str) -> None:
    """Opening, migrating or dropping a system schema is refused at URL parsing; no table or schema changes."""
    url = with_options(server, schema=schema)
    with psycopg.connect(server, autocommit=True) as connection:
        views_before = connection.execute(
            "SELECT count(*) FROM pg_catalog.pg_views WHERE schemaname = 'information_schema'"
        ).fetchone()
        for opener in (PostgresJournal, PostgresLeaseStore):
            with pytest.raises(InvalidBackendURL, match="system schema"):
                opener(url)
        for command in (["migrate", url], ["status", url], ["drop", "--yes", url]):
            result = subprocess.run(
                [sys.executable, "-m", "mayfly_postgres", *command],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 1, result.stdout + result.stderr
            assert (
                result.stderr.startswith("error: invalid PostgreSQL URL") and "system schema" in result.stderr
            )
            assert len(result.stderr.strip().splitlines()) == 1
        assert _mayfly_tables(connection, schema) == []
        assert (
            connection.execute(
                "SELECT count(*) FROM pg_catalog.pg_views WHERE schemaname = 'information_schema'"
            ).fetchone()
            == views_before
        )
        assert views_before is not None and views_before[0] > 0


def test_a_schema_with_a_raw_newline_is_refused_not_rewritten(server: str, new_schema: str) -> None:
    """schema=NAME\\r\\nx is refused; the schema NAMEx that stripping CR/LF would give is never created."""
    with pytest.raises(InvalidBackendURL, match="control character"):
        PostgresJournal(with_options(server, schema=f"{new_schema[:-1]}\r\n{new_schema[-1]}"))
    with psycopg.connect(server, autocommit=True) as connection:
        assert applied_version(connection, new_schema) == 0
        assert connection.execute(
            "SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = %s", (new_schema,)
        ).fetchone() == (0,)
