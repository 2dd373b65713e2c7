"""URL parsing: options, defaults, sizes and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from mayfly.journal import Durability
from mayfly.model.errors import InvalidBackendURL
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore
from mayfly_lmdb._url import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, format_size, parse_url


def test_defaults_are_sync_and_writable() -> None:
    """A bare URL means durable sync commits, a 1 GiB map growing to 1 TiB, read-write."""
    target = parse_url("lmdb:///var/lib/x")
    assert target.path == Path("/var/lib/x")
    assert target.sync and target.durability is Durability.DURABLE
    assert (target.map_size, target.max_map_size) == (DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE)
    assert not target.readonly
    assert target.url == "lmdb:///var/lib/x"


def test_options_are_parsed() -> None:
    """durability, sizes with binary suffixes and readonly are read from the query."""
    target = parse_url("lmdb:///e?durability=nosync&map_size=64k&max_map_size=2GiB&readonly=true")
    assert not target.sync and target.durability is Durability.WRITE
    assert target.durability_name == "nosync"
    assert (target.map_size, target.max_map_size) == (64 << 10, 2 << 30)
    assert target.readonly
    assert parse_url("lmdb:///e?map_size=1048576").map_size == 1 << 20
    assert parse_url("lmdb://localhost/e").path == Path("/e")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "file:///e",
        "lmdb://",
        "lmdb:///e?durability=fsync",
        "lmdb:///e?colour=blue",
        "lmdb:///e?map_size=lots",
        "lmdb:///e?map_size=1k",
        "lmdb:///e?map_size=1g&max_map_size=512m",
        "lmdb:///e?readonly=maybe",
        "lmdb:///e?durability=sync&durability=nosync",
        "lmdb://user@host/e",
        "lmdb:///e#frag",
        "lmdb:///e?=x&&",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    """Malformed URLs, unknown or repeated options and impossible sizes raise InvalidBackendURL."""
    with pytest.raises(InvalidBackendURL):
        parse_url(url)


@pytest.mark.parametrize(
    "url", ["lmdb:///srv/en\nv", "lmdb:///srv/env\r\n", "lmdb:///srv/\tenv", "lmdb:///e\x00"]
)
def test_raw_control_characters_are_refused_not_stripped(url: str) -> None:
    """A raw control character is refused (urlsplit would delete CR, LF and tab and open another directory)."""
    with pytest.raises(InvalidBackendURL, match="control character") as caught:
        parse_url(url)
    assert "\n" not in str(caught.value) and "\r" not in str(caught.value)


def test_sizes_are_formatted_in_binary_units() -> None:
    """format_size names the largest binary unit that divides the size exactly."""
    assert [format_size(size) for size in (1 << 40, 3 << 30, 64 << 20, 8 << 10, 1000)] == [
        "1TiB",
        "3GiB",
        "64MiB",
        "8KiB",
        "1000",
    ]


def test_a_directory_with_a_raw_newline_is_never_created(tmp_path: Path) -> None:
    """Opening lmdb://DIR/en<LF>v raises InvalidBackendURL and creates neither DIR/env nor anything else."""
    with pytest.raises(InvalidBackendURL, match="control character"):
        LmdbJournal(f"lmdb://{tmp_path}/en\nv")
    with pytest.raises(InvalidBackendURL, match="control character"):
        LmdbLeaseStore(f"lmdb://{tmp_path}/en\r\nv")
    assert list(tmp_path.iterdir()) == []
