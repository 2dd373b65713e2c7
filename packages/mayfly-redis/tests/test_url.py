"""Redis backend URLs: options, defaults, redaction and refusal of anything malformed."""

from __future__ import annotations

import pytest

from mayfly.model.errors import InvalidBackendURL
from mayfly_redis import RedisDurability, parse_url


def test_defaults() -> None:
    """A bare redis://host URL means port 6379, database 0, prefix mayfly, durability aof, 30 s timeout."""
    target = parse_url("redis://cache.internal")
    assert (target.host, target.port, target.db, target.prefix) == ("cache.internal", 6379, 0, "mayfly")
    assert target.durability is RedisDurability.AOF
    assert target.timeout_s == 30.0
    assert not target.tls


def test_every_option() -> None:
    """Credentials, TLS, database, prefix, durability and timeout are all read from the URL."""
    target = parse_url("rediss://app:p%40ss@10.0.0.5:6380/4?prefix=jobs.v1&durability=memory&timeout=2.5")
    assert target.tls
    assert (target.username, target.password) == ("app", "p@ss")
    assert (target.host, target.port, target.db) == ("10.0.0.5", 6380, 4)
    assert (target.prefix, target.durability, target.timeout_s) == ("jobs.v1", RedisDurability.MEMORY, 2.5)
    assert "p@ss" not in target.url and "p%40ss" not in target.url and "***" in target.url
    assert target.address == "10.0.0.5:6380/4"


def test_tls_trusts_a_named_ca_bundle() -> None:
    """rediss:// takes ca_certs=PATH; plain redis:// leaves it unset."""
    assert parse_url("rediss://h/0?ca_certs=/etc/mayfly/ca.pem").ca_certs == "/etc/mayfly/ca.pem"
    assert parse_url("redis://h/0").ca_certs is None


def test_keys_are_hash_tagged_by_run() -> None:
    """Run keys are PREFIX:{RUN}:NAME and the run index is PREFIX:runs."""
    target = parse_url("redis://h/0?prefix=p")
    run = "0190a0b0-0000-7000-8000-000000000001"
    assert target.key(run, "records") == "p:{0190a0b0-0000-7000-8000-000000000001}:records"
    assert target.runs_key == "p:runs"


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("http://h:6379/0", "redis:// or rediss://"),
        ("redis:///0", "names no host"),
        ("redis://h/abc", "database must be a number"),
        ("redis://h/70000", "out of range"),
        ("redis://h/0?prefix=a{b}", "prefix"),
        ("redis://h/0?prefix=", "prefix"),
        ("redis://h/0?durability=fsync", "durability='fsync' must be"),
        ("redis://h/0?timeout=0", "timeout"),
        ("redis://h/0?timeout=soon", "timeout"),
        ("redis://h/0?db=1", "unknown option 'db'"),
        ("redis://h/0?prefix=a&prefix=b", "given twice"),
        ("redis://h:notaport/0", "malformed"),
        ("redis://h/0#frag", "fragment"),
        ("redis://h/0?ca_certs=/etc/ca.pem", "ca_certs needs a rediss://"),
        ("rediss://h/0?ca_certs=", "ca_certs needs a rediss://"),
    ],
)
def test_malformed_urls_are_refused(url: str, complaint: str) -> None:
    """Each malformed URL raises InvalidBackendURL saying what is wrong."""
    with pytest.raises(InvalidBackendURL, match=complaint):
        parse_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h/0?prefix=x\r\nFLUSHALL",
        "redis://h/0?prefix=x\nFLUSHALL",
        "redis://h/0?prefix=a\tb",
        "redis://h/0?prefix=a\x00b",
        "redis://h/0?prefix=a\x7fb",
        "redis://h\r\n/0",
    ],
)
def test_raw_control_characters_are_refused_not_stripped(url: str) -> None:
    """A raw control character is refused with InvalidBackendURL (urlsplit would delete CR, LF and tab)."""
    with pytest.raises(InvalidBackendURL, match="control character") as caught:
        parse_url(url)
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)


def test_password_never_appears_in_errors() -> None:
    """An error about a URL with a password shows it redacted."""
    with pytest.raises(InvalidBackendURL) as caught:
        parse_url("redis://u:hunter2@h/0?bogus=1")
    assert "hunter2" not in str(caught.value)
