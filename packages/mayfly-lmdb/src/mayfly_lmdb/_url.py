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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

from mayfly.backend import BackendURL, parse_backend_url
from mayfly.journal import Durability

__all__ = [
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_MAP_SIZE",
    "MIN_MAP_SIZE",
    "LmdbOptions",
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

_MAX_SIZE: Final = 1 << 50
_SHAPE: Final = "lmdb:///DIR?durability=sync|nosync&map_size=1GiB&max_map_size=1TiB&readonly=false"
_SIZE = re.compile(r"([0-9]{1,20})\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_SHIFT: Final = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


class MapSize(int):
    """A map size in bytes, written in a URL as bytes or with a binary suffix (``64MiB``, ``2g``)."""


def format_size(size: int) -> str:
    """Return ``size`` in the largest binary unit that divides it (``64MiB``, ``1TiB``, ``1000``)."""
    for suffix, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def _convert(kind: type, value: Any) -> Any:
    """Convert URL text into a :class:`MapSize` (the kit's parser calls this for custom types)."""
    if kind is not MapSize:
        raise NotImplementedError(kind)
    match = _SIZE.fullmatch(str(value).strip())
    if match is None:
        raise ValueError("is not a size; use bytes or a suffix like 64MiB or 2GiB")
    size = int(match.group(1)) << _SHIFT[(match.group(2) or "").lower()]
    if not MIN_MAP_SIZE <= size <= _MAX_SIZE:
        raise ValueError(f"must be between {format_size(MIN_MAP_SIZE)} and 1PiB")
    return MapSize(size)


class LmdbOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of an ``lmdb://`` URL (see the module docstring)."""

    durability: Annotated[Literal["sync", "nosync"], msgspec.Meta(description="sync or nosync")] = "sync"
    map_size: MapSize | None = None
    max_map_size: MapSize | None = None
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class LmdbTarget:
    """A parsed ``lmdb://`` URL: where the environment lives and how it is opened."""

    path: Path
    sync: bool
    map_size: int
    max_map_size: int
    readonly: bool
    url: str
    source: BackendURL[LmdbOptions] | None = field(default=None, repr=False, compare=False)

    @property
    def durability(self) -> Durability:
        """``durable`` for ``sync``; ``write`` (survives the process, not the host) for ``nosync``."""
        return Durability.DURABLE if self.sync else Durability.WRITE

    @property
    def durability_name(self) -> str:
        """The URL spelling of the durability: ``sync`` or ``nosync``."""
        return "sync" if self.sync else "nosync"


def parse_url(url: str) -> LmdbTarget:
    """Parse ``lmdb:///DIR?options`` into an :class:`LmdbTarget`; bad input raises InvalidBackendURL."""
    parsed = parse_backend_url(url, LmdbOptions, _SHAPE, kind="path", dec_hook=_convert)
    options = parsed.options
    map_size = DEFAULT_MAP_SIZE if options.map_size is None else int(options.map_size)
    max_map_size = (
        max(DEFAULT_MAX_MAP_SIZE, map_size) if options.max_map_size is None else int(options.max_map_size)
    )
    if max_map_size < map_size:
        raise parsed.invalid(
            f"max_map_size {format_size(max_map_size)} is smaller than map_size {format_size(map_size)}"
        )
    root = Path(parsed.location).expanduser().absolute()
    query = parsed.url.partition("?")[2]
    return LmdbTarget(
        path=root,
        sync=options.durability == "sync",
        map_size=map_size,
        max_map_size=max_map_size,
        readonly=options.readonly,
        url=f"lmdb://{root}" + (f"?{query}" if query else ""),
        source=parsed,
    )
