"""URL parsing: Mayfly options split from libpq parameters, defaults, and precise refusals."""

from __future__ import annotations

import pytest

from mayfly.journal import Durability
from mayfly.model.errors import InvalidBackendURL
from mayfly_postgres import parse_url


def test_defaults() -> None:
    """A bare URL means schema mayfly, durable commits, automatic migrations, 8 connections, 15 s retries."""
    settings = parse_url("postgresql://app@db.internal:5432/prod")
    assert (settings.schema, settings.durability, settings.migrate) == ("mayfly", Durability.DURABLE, "auto")
    assert (settings.pool_size, settings.reconnect_timeout) == (8, 15.0)
    assert settings.synchronous_commit == "on"
    assert settings.conninfo == "postgresql://app@db.internal:5432/prod?application_name=mayfly"


def test_mayfly_options_are_removed_and_libpq_ones_kept() -> None:
    """schema/durability/migrate/pool_size/reconnect_timeout are Mayfly's; sslmode and others go to libpq."""
    settings = parse_url(
        "postgres://app:s3cret@db:6432/prod?sslmode=require&schema=tenant_7&durability=write"
        "&migrate=never&pool_size=3&reconnect_timeout=2.5&application_name=worker%201"
    )
    assert (settings.schema, settings.durability, settings.migrate) == ("tenant_7", Durability.WRITE, "never")
    assert (settings.pool_size, settings.reconnect_timeout, settings.synchronous_commit) == (3, 2.5, "off")
    assert (
        settings.conninfo
        == "postgresql://app:s3cret@db:6432/prod?sslmode=require&application_name=worker%201"
    )


def test_libpq_options_are_kept_and_mayfly_setting_comes_last() -> None:
    """The URL's options reach the server, followed by the synchronous_commit Mayfly requires."""
    settings = parse_url("postgresql://db/prod?options=-c%20search_path%3Dapp&durability=write")
    assert settings.options == "-c search_path=app"
    assert settings.startup_options == "-c search_path=app -c synchronous_commit=off"
    assert "options" not in settings.conninfo


def test_password_is_redacted_in_the_url() -> None:
    """The public url hides the password; only the libpq conninfo carries it."""
    settings = parse_url("postgresql://app:s3cret@db/prod")
    assert "s3cret" not in settings.url and "***" in settings.url
    assert "s3cret" in settings.conninfo


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://db/prod", "scheme"),
        ("postgresql://db/prod?schema=Bad-Name", "schema="),
        ("postgresql://db/prod?schema=pg_catalog", "schema="),
        ("postgresql://db/prod?durability=fsync", "durability="),
        ("postgresql://db/prod?migrate=sometimes", "migrate="),
        ("postgresql://db/prod?pool_size=0", "pool_size="),
        ("postgresql://db/prod?pool_size=2.5", "pool_size="),
        ("postgresql://db/prod?reconnect_timeout=soon", "reconnect_timeout="),
        ("postgresql://db/prod?schema=a&schema=b", "twice"),
        ("postgresql://db:99999/prod", "(?i)port"),
        ("postgresql://db/prod#frag", "fragment"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, problem: str) -> None:
    """Every malformed URL raises InvalidBackendURL naming what is wrong and the expected shape."""
    with pytest.raises(InvalidBackendURL, match=problem) as caught:
        parse_url(url)
    assert "expected postgresql://" in str(caught.value)


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "pg_toast", "pg_temp_3", "pg_mayfly"])
def test_system_schemas_are_refused(schema: str) -> None:
    """information_schema and every pg_* schema are PostgreSQL's own: refused, naming the option and a fix."""
    with pytest.raises(
        InvalidBackendURL, match=rf"schema='{schema}' is a PostgreSQL system schema; name"
    ) as caught:
        parse_url(f"postgresql://db/prod?schema={schema}")
    assert "schema=mayfly" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db/prod?schema=mayfly\r\nx",
        "postgresql://db/prod?schema=may\tfly",
        "postgresql://db/pr\nod?schema=mayfly",
        "postgresql://d\x00b/prod",
        "postgresql://db/prod?application_name=a\x7fb",
    ],
)
def test_raw_control_characters_are_refused_not_stripped(url: str) -> None:
    """A raw control character anywhere in the URL is refused (urlsplit would silently delete CR, LF, tab)."""
    with pytest.raises(InvalidBackendURL, match="control character") as caught:
        parse_url(url)
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)


def test_non_string_url_is_refused() -> None:
    """A URL that is not a string is an InvalidBackendURL, not a TypeError."""
    with pytest.raises(InvalidBackendURL):
        parse_url(b"postgresql://db/prod")
