"""Parsing of ``lmdb://`` URLs: the environment directory and its options.

``lmdb:///path/to/env?durability=sync|nosync&map_size=1GiB&max_map_size=1TiB&readonly=false``

* ``durability``: ``sync`` (default) acknowledges after LMDB's durable commit
  (data and meta page flushed with ``fdatasync``); ``nosync`` acknowledges
  once the pages are handed to the OS, so it survives the process but not the
  host, and must be asked for by name.
* ``map_size``: the initial memory map (and thus file size limit) in bytes,
  with an optional binary suffix ``k``, ``m``, ``g``, ``t`` (``KiB`` ... also
  accepted). The map grows on demand up to ``max_map_size``.
* ``readonly``: open for reading only (an inspector); appends are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from mayfly.journal import Durability
from mayfly.model.errors import InvalidBackendURL

__all__ = [
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_MAP_SIZE",
    "MIN_MAP_SIZE",
    "LmdbTarget",
    "format_size",
    "parse_url",
]

DEFAULT_MAP_SIZE: Final = 1 << 30
"""Initial map size: 1 GiB of address space (the file only grows as pages are written)."""

DEFAULT_MAX_MAP_SIZE: Final = 1 << 40
"""Largest map the journal grows to on its own: 1 TiB."""

MIN_MAP_SIZE: Final = 64 << 10
"""Smallest accepted map size (LMDB needs a few pages for its named databases)."""

_OPTIONS: Final = ("durability", "map_size", "max_map_size", "readonly")
_SIZE = re.compile(r"([0-9]{1,20})\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_SHIFT: Final = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BOOLEAN: Final = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True, slots=True)
class LmdbTarget:
    """A parsed ``lmdb://`` URL: where the environment lives and how it is opened."""

    path: Path
    sync: bool
    map_size: int
    max_map_size: int
    readonly: bool
    url: str

    @property
    def durability(self) -> Durability:
        """``durable`` for ``sync``; ``write`` (survives the process, not the host) for ``nosync``."""
        return Durability.DURABLE if self.sync else Durability.WRITE

    @property
    def durability_name(self) -> str:
        """The URL spelling of the durability: ``sync`` or ``nosync``."""
        return "sync" if self.sync else "nosync"


def format_size(size: int) -> str:
    """Return ``size`` in the largest binary unit that divides it (``64MiB``, ``1TiB``, ``1000``)."""
    for suffix, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def _size(url: str, name: str, text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise InvalidBackendURL(
            f"lmdb URL {url!r}: {name}={text!r} is not a size; use bytes or a suffix like 64MiB or 2GiB"
        )
    size = int(match.group(1)) << _SHIFT[(match.group(2) or "").lower()]
    if not MIN_MAP_SIZE <= size <= 1 << 50:
        raise InvalidBackendURL(
            f"lmdb URL {url!r}: {name}={text} must be between {format_size(MIN_MAP_SIZE)} and 1PiB"
        )
    return size


def parse_url(url: str) -> LmdbTarget:
    """Parse ``lmdb:///DIR?options`` into an :class:`LmdbTarget`; bad input raises InvalidBackendURL."""
    if not isinstance(url, str) or not url:
        raise InvalidBackendURL(f"lmdb journal URL must be a non-empty string, got {url!r}")
    control = _CONTROL.search(url)
    if control is not None:
        # urlsplit() silently deletes raw tab, CR and LF (bpo-43882): another directory would open.
        raise InvalidBackendURL(
            f"lmdb journal URL {url!r} holds the control character {control.group()!r} at position "
            f"{control.start()}; remove it (a URL is never rewritten to drop one)"
        )
    parts = urlsplit(url)
    if parts.scheme.lower() != "lmdb":
        raise InvalidBackendURL(f"lmdb journal URL {url!r} must use the lmdb:// scheme")
    if parts.username is not None or parts.port is not None or parts.fragment:
        raise InvalidBackendURL(f"lmdb journal URL {url!r} takes no user, port or fragment")
    host = parts.netloc if parts.netloc not in ("", "localhost") else ""
    path = host + parts.path
    if not path:
        raise InvalidBackendURL(f"lmdb journal URL {url!r} names no directory; use lmdb:///path/to/env")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise InvalidBackendURL(f"lmdb journal URL {url!r} has a malformed query") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in _OPTIONS:
            raise InvalidBackendURL(
                f"lmdb journal URL {url!r} has unknown option {name!r}; options are {', '.join(_OPTIONS)}"
            )
        if name in options:
            raise InvalidBackendURL(f"lmdb journal URL {url!r} repeats option {name!r}")
        options[name] = value
    durability = options.get("durability", "sync")
    if durability not in ("sync", "nosync"):
        raise InvalidBackendURL(
            f"lmdb journal URL {url!r}: durability must be sync or nosync, got {durability!r}"
        )
    map_size = _size(url, "map_size", options["map_size"]) if "map_size" in options else DEFAULT_MAP_SIZE
    max_map_size = (
        _size(url, "max_map_size", options["max_map_size"])
        if "max_map_size" in options
        else max(DEFAULT_MAX_MAP_SIZE, map_size)
    )
    if max_map_size < map_size:
        raise InvalidBackendURL(
            f"lmdb journal URL {url!r}: max_map_size {format_size(max_map_size)} is smaller than "
            f"map_size {format_size(map_size)}"
        )
    readonly_text = options.get("readonly", "false").lower()
    if readonly_text not in _BOOLEAN:
        raise InvalidBackendURL(f"lmdb journal URL {url!r}: readonly must be true or false")
    root = Path(path).expanduser().absolute()
    canonical = f"lmdb://{root}" + (f"?{parts.query}" if parts.query else "")
    return LmdbTarget(
        path=root,
        sync=durability == "sync",
        map_size=map_size,
        max_map_size=max_map_size,
        readonly=_BOOLEAN[readonly_text],
        url=canonical,
    )
