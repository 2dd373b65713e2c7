"""The ``lmdb://`` backend of Mayfly: an embedded journal and recovery leases on one LMDB environment.

Install with ``pip install "mayfly-runtime[lmdb]"`` and open by URL::

    lmdb:///var/lib/app/mayfly?durability=sync&map_size=1GiB&max_map_size=1TiB

Options (all optional):

* ``durability=sync`` (default): an append returns after LMDB's durable
  commit, so it survives a host crash; ``durability=nosync`` returns once the
  pages are handed to the OS (survives the process dying, not the host) and
  must be chosen explicitly. ``mayfly backends`` reports which one is used.
* ``map_size`` (default ``1GiB``): the initial map; it grows on demand,
  doubling, up to ``max_map_size`` (default ``1TiB``), after which appends
  raise :class:`LmdbMapFull` naming the option to raise.
* ``readonly=true``: an inspector that reads while other processes write.

Several processes of one host may share the environment: appends of any run
are compare-and-append inside one LMDB write transaction. Recovery leases
expire unless renewed, a holder's death is seen at once through a ``flock``
the OS releases, and fencing tokens are stored in the environment.

Workers (``mayfly worker``) find runs through the run index, which each
append writes in its own transaction; a claim selects runs and grants their
leases in one transaction, so no run goes to two workers, and idle workers
are woken through FIFOs in ``DIR/wakeups``. Writes of many runs share one
commit and one sync (group commit), and from a hub task they wait on an
offload thread, so the hub never waits for the disk.
"""

from __future__ import annotations

from typing import Final

from mayfly.backend import backend_hooks
from mayfly_lmdb._env import LmdbMapFull
from mayfly_lmdb._journal import LmdbJournal
from mayfly_lmdb._lease import LmdbLeaseGuard, LmdbLeaseStore
from mayfly_lmdb._url import format_size, parse_url

__all__ = [
    "DISTRIBUTION",
    "MAYFLY_PLUGIN_API",
    "LmdbJournal",
    "LmdbLeaseGuard",
    "LmdbLeaseStore",
    "LmdbMapFull",
    "describe",
]

MAYFLY_PLUGIN_API: Final = 1
"""The Mayfly plugin API this backend was written for (checked when the plugin loads)."""

DISTRIBUTION: Final = "mayfly-lmdb"
"""The installable distribution, named in error messages."""

_SUMMARY: Final = (
    "LMDB environment journal, durability sync|nosync, map grows on demand, expiring fenced leases, "
    "run index for workers"
)


def describe(url: str) -> str:
    """One line for ``mayfly backends``: where the environment is and what an acknowledgement means."""
    if url in ("lmdb://", ""):
        return _SUMMARY
    target = parse_url(url)
    if target.sync:
        durability = "sync (durable: survives a host crash)"
    else:
        durability = "nosync (write: survives the process, NOT a host crash)"
    mode = ", read-only" if target.readonly else ""
    return (
        f"LMDB environment at {target.path}, durability {durability}, map_size "
        f"{format_size(target.map_size)} growing to {format_size(target.max_map_size)}{mode}, "
        "expiring fenced leases, run index for workers"
    )


def _exists(url: str) -> bool:
    """Whether an LMDB store is at ``url``: its directory holds an environment (nothing is created)."""
    return (parse_url(url).path / "data.mdb").is_file()


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    ("lmdb",), DISTRIBUTION, LmdbJournal, LmdbLeaseStore, describe=describe, exists=_exists, summary=_SUMMARY
)
