"""The plugin module: entry point, API declaration, scheme resolution and backend descriptions."""

from __future__ import annotations

import uuid

from mayfly.plugins import list_backends, open_journal, open_leases
from mayfly_postgres import MAYFLY_PLUGIN_API, PostgresJournal, PostgresLeaseStore


def test_urls_resolve_through_the_plugin_manager(url: str) -> None:
    """postgresql:// and postgres:// URLs open this backend's journal and lease store."""
    assert MAYFLY_PLUGIN_API == 1
    with open_journal(url) as journal, open_leases(url.replace("postgresql://", "postgres://", 1)) as leases:
        assert isinstance(journal, PostgresJournal)
        assert isinstance(leases, PostgresLeaseStore)


def test_backends_listing_describes_durability(url: str) -> None:
    """mayfly backends lists both schemes for journals and leases, naming the durability."""
    rows = [row for row in list_backends(url) if row.distribution == "mayfly-postgres"]
    assert {(row.kind, row.scheme) for row in rows} == {
        (kind, scheme) for kind in ("journal", "lease") for scheme in ("postgresql", "postgres")
    }
    described = next(row for row in rows if row.kind == "journal" and row.scheme == "postgresql")
    assert "synchronous_commit=on" in described.description and "***" not in described.description


def test_read_only_commands_refuse_a_schema_that_holds_no_store_and_create_nothing() -> None:
    """`mayfly runs` on a mistyped ?schema= says there is no journal (exit 5) and creates no schema."""
    import psycopg

    from mayfly.cli import main

    schema = "mayfly_typo_" + uuid.uuid4().hex[:8]
    url = f"postgresql://postgres@127.0.0.1:5432/test?schema={schema}"
    assert main(["--journal", url, "runs"]) == 5
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test") as connection:
        row = connection.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert row is not None and row[0] == 0
