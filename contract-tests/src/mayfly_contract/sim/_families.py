"""The seed families a campaign picks from: each is ``Callable[[SeedContext], SeedResult]`` with a weight.

The driver picks one family per seed, seeded (``random.Random(seed)``), among
the families that run on the campaign's backend, with probability
proportional to their weights. To add a family, write it in its own module
and append it here, one line::

    FAMILIES.append(Family("net", net_family, weight=2, backends=frozenset({"postgres", "redis"})))
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from mayfly_contract.sim._context import SeedContext, SeedResult
from mayfly_contract.sim._crash import crash_family
from mayfly_contract.sim._lease import lease_family
from mayfly_contract.sim._net import NET_BACKENDS, net_family
from mayfly_contract.sim._procs import PROCESS_BACKENDS, sigkill_family, workers_family
from mayfly_contract.sim._queue import queue_family
from mayfly_contract.sim._storage import storage_family

__all__ = ["FAMILIES", "Family", "families_for", "pick_family"]


@dataclass(frozen=True)
class Family:
    """A kind of seed: its name, what runs it, how often it is picked, and its backends (``None``: all)."""

    name: str
    run: Callable[[SeedContext], SeedResult]
    weight: int = 1
    backends: frozenset[str] | None = None
    min_workers: int = 1
    """The family runs only in campaigns with at least this many workers (``--workers``)."""

    def runs_on(self, backend: str, workers: int = 1) -> bool:
        """Whether the family applies to a campaign on ``backend`` with ``workers`` workers."""
        return (self.backends is None or backend in self.backends) and workers >= self.min_workers


FAMILIES: list[Family] = [
    Family("crash", crash_family, weight=6),
    Family("storage", storage_family, weight=3, backends=frozenset({"file", "lmdb"})),
    Family("lease", lease_family, weight=1),
    Family(
        "queue", queue_family, weight=1, backends=frozenset({"memory", "file", "lmdb", "postgres", "redis"})
    ),
    # Real processes, seconds a seed: about 1 seed in 10; the workers family half the seeds of --workers K.
    Family("sigkill", sigkill_family, weight=1, backends=PROCESS_BACKENDS),
    Family("net", net_family, weight=1, backends=NET_BACKENDS),
    Family("workers", workers_family, weight=10, backends=PROCESS_BACKENDS, min_workers=2),
]


def families_for(backend: str, workers: int = 1) -> list[Family]:
    """The families that run on ``backend`` with ``workers`` workers, in registration order."""
    return [family for family in FAMILIES if family.runs_on(backend, workers)]


def pick_family(seed: int, backend: str, workers: int = 1, *, only: str | None = None) -> Family:
    """The family of ``seed`` (or the family named ``only``): a seeded weighted choice."""
    candidates = families_for(backend, workers)
    if only is not None:
        chosen = [family for family in candidates if family.name == only]
        if not chosen:
            names = ", ".join(family.name for family in candidates)
            raise ValueError(f"no family {only!r} runs on {backend}; choose one of {names}")
        return chosen[0]
    chooser = random.Random(f"family:{seed}")
    return chooser.choices(candidates, weights=[family.weight for family in candidates])[0]
