"""Where a run's keys live: one layout per store, chosen when it opens (``P`` the prefix, ``R`` a run id).

Three layouts:

* **standalone** (a server without cluster mode): a run's keys are
  ``P:{R}:name``, the run listing ``P:runs`` and the queue structures
  ``P:{q:Q}:name`` (see :mod:`mayfly_redis._index`). Every script may touch
  any key, so nothing more is needed.
* **sharded** (a Redis Cluster store created by this version): the run index
  is split into ``S`` shards (``?shards=S``, 16 by default, fixed when the store
  is created). A run belongs to shard ``crc32(R) mod S`` and *every* key of the
  run and of its shard's index shares the shard's hash tag ``{P:k}``:
  ``P:{P:k}:R:name`` for the run, ``P:{P:k}:runs`` for the shard's listing,
  ``P:{P:k}:q:Q:name`` for the shard's part of queue ``Q``. One shard is one
  slot, so the append script checks the fence, appends, stores the index
  entry and files the run in its queue atomically, exactly as on a standalone
  server, and a claim script selects and leases within one shard atomically.
  The store records ``sharded S`` under ``P:layout`` when it is created;
  a URL naming another ``shards`` is refused.
* **unsharded** (a Cluster store written before sharding: ``P:runs`` exists
  and ``P:layout`` does not): the keys of the standalone layout, a journal
  without a run index, kept working unchanged. Workers need a sharded store
  (a new prefix).
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass
from typing import Final, final

__all__ = ["DEFAULT_SHARDS", "MAX_SHARDS", "Layout", "LayoutKind"]

DEFAULT_SHARDS: Final = 16
MAX_SHARDS: Final = 1024


class LayoutKind(enum.StrEnum):
    """Which key layout a store uses."""

    STANDALONE = "standalone"
    SHARDED = "sharded"
    UNSHARDED = "unsharded"


@final
@dataclass(frozen=True, slots=True)
class Layout:
    """The key names of one store."""

    kind: LayoutKind
    prefix: str
    shards: int = 1

    @property
    def sharded(self) -> bool:
        """Whether run keys sit under their shard's hash tag (a Cluster store with a run index)."""
        return self.kind is LayoutKind.SHARDED

    @property
    def indexed(self) -> bool:
        """Whether the store keeps the run index (standalone or sharded)."""
        return self.kind is not LayoutKind.UNSHARDED

    def shard(self, run_id: str) -> int:
        """The shard of ``run_id``: ``crc32(run_id) mod shards`` (0 when not sharded)."""
        return zlib.crc32(run_id.encode()) % self.shards if self.sharded else 0

    def base(self, shard: int) -> str:
        """The prefix the index scripts build keys from: ``P`` or, sharded, ``P:{P:k}``."""
        return f"{self.prefix}:{{{self.prefix}:{shard}}}" if self.sharded else self.prefix

    @property
    def bases(self) -> list[str]:
        """Every shard's base, in shard order (one, the prefix, when not sharded)."""
        return [self.base(shard) for shard in range(self.shards)]

    def run_base(self, run_id: str) -> str:
        """The base of ``run_id``'s shard."""
        return self.base(self.shard(run_id))

    def key(self, run_id: str, name: str) -> str:
        """The key ``name`` of ``run_id``."""
        if self.sharded:
            return f"{self.run_base(run_id)}:{run_id}:{name}"
        return f"{self.prefix}:{{{run_id}}}:{name}"

    def runs_key(self, base: str) -> str:
        """The sorted set listing the runs of the shard with ``base`` (``P:runs`` when not sharded)."""
        return f"{base}:runs"

    def route(self, base: str) -> list[str]:
        """The keys to declare so a shard's script runs on the node of its slot (none on standalone)."""
        return [self.runs_key(base)] if self.sharded else []

    @property
    def marker_key(self) -> str:
        """The key recording a Cluster store's layout (``sharded S``)."""
        return f"{self.prefix}:layout"
