"""Mayfly's deterministic seeded simulator: ``python -m mayfly_contract.sim --backend B --seeds N``.

A campaign runs seeds ``0 .. N-1`` (or ``--seed S``) on one backend. Every
seed is reproducible from its number alone: it picks a seed family
(:mod:`mayfly_contract.sim._families`), draws a workflow with
:func:`mayfly.testing.generate_workflow`, runs it fault-free on a memory
store for the expected result, then on the backend under the family's seeded
faults, and checks :func:`mayfly.testing.check_invariants` after every
restart and at the end. Families:

- ``crash``: deaths before and after journal operations and after handler
  effects (the runtime abandoned, the backend reopened, a new owner
  recovering), typed EIO/ENOSPC at write time, wall-clock jumps forward and
  back, and long downtimes;
- ``storage`` (file, LMDB): the stores' bytes damaged between a death and the
  recovery: torn and short tails of unacknowledged writes, bit flips, a
  damaged frame length, a snapshot copied from another run. Recovery must
  either keep every acknowledged record or fail closed with a typed
  :class:`~mayfly.errors.CorruptionError`;
- ``lease``: two claimants racing for a run, and a stale owner that wakes up
  after its lease expired and another owner took over, including expiry in
  the middle of a commit: fencing must refuse the stale owner.

``nox -s sim -- --backend file --seeds 60`` runs 60 seeds; docs/testing.md
describes the invariants and :func:`mayfly.testing.simulate`, which runs a
user's own workflow under the same crash and time faults.
"""

from mayfly_contract.sim._context import Backend, SeedContext, SeedResult, open_backend
from mayfly_contract.sim._driver import Campaign, main, reproduce_command, run_campaign, run_seed
from mayfly_contract.sim._families import FAMILIES, Family, families_for, pick_family

__all__ = [
    "FAMILIES",
    "Backend",
    "Campaign",
    "Family",
    "SeedContext",
    "SeedResult",
    "families_for",
    "main",
    "open_backend",
    "pick_family",
    "reproduce_command",
    "run_campaign",
    "run_seed",
]
