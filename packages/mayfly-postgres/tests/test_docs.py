"""The backend's docs page: its python examples run in order, and its permission list is sufficient.

The repository's docs env runs the page's examples too (against the CI server,
in schema ``mayfly_docs``); this module runs them in this package's own env,
against the test server, in a fresh schema it drops afterwards.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg
import pytest
from pgserver import IDS, batch, drop_schema, fresh_schema, with_options

from mayfly_postgres import PostgresJournal, PostgresLeaseStore
from mayfly_postgres._schema import migrate
from mayfly_postgres._url import parse_url

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "postgres.md"
DOCS_URL = "postgresql://postgres@127.0.0.1:5432/test"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_GRANTS = re.compile(r"^GRANT .*?;$", re.MULTILINE | re.DOTALL)


def test_every_python_example_of_the_page_runs(server: str) -> None:
    """The page's python blocks execute in sequence in one namespace without raising."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = _BLOCK.findall(text)
    assert len(blocks) == 4
    schema = fresh_schema()
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        for block in blocks:
            line = text[: text.index(block)].count("\n")
            # The same server unless a private cluster stands in; never the docs env's schema.
            source = block.replace(DOCS_URL, server).replace("schema=mayfly_docs", f"schema={schema}")
            exec(compile("\n" * line + source, str(PAGE), "exec"), namespace)
    finally:
        drop_schema(server, schema)


def test_documented_grants_are_enough_for_the_runtime_role(server: str) -> None:
    """A role holding only the page's GRANTs appends, reads and leases on a migrated schema, and cannot delete."""
    schema, role = fresh_schema(), f"mayfly_runtime_{uuid.uuid4().hex[:8]}"
    admin_url = with_options(server, schema=schema)
    text = PAGE.read_text(encoding="utf-8")
    grants = [
        g.replace(" mayfly.", f" {schema}.")
        .replace("SCHEMA mayfly ", f"SCHEMA {schema} ")
        .replace("mayfly_runtime", role)
        for g in _GRANTS.findall(text)
    ]
    assert len(grants) == 5  # the page grants five (migration 4 added the schedules table)
    with psycopg.connect(server, autocommit=True) as admin:
        migrate(admin, parse_url(admin_url))
        admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
        for grant in grants:
            admin.execute(grant.encode())
    parts = server.split("://", 1)[1].split("@", 1)
    role_url = with_options(f"postgresql://{role}@{parts[-1]}", schema=schema, migrate="never")
    try:
        with PostgresJournal(role_url) as journal, PostgresLeaseStore(role_url) as leases:
            run = IDS.new_id()
            with leases.acquire(run, "restricted", 10_000) as lease:
                records = batch(run, 1)
                journal.append(run, 1, records, fence=lease.fencing_token)
            assert journal.read(run) == records
            assert journal.list_runs(after=None, limit=10)
        with (
            psycopg.connect(f"postgresql://{role}@{parts[-1]}") as connection,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            connection.execute(
                psycopg.sql.SQL("DELETE FROM {}").format(psycopg.sql.Identifier(schema, "records"))
            )
    finally:
        drop_schema(server, schema)
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))
