"""Helpers for testing workflows and Mayfly itself; shipped so users can test their own workflows.

- :class:`ReducerHarness` drives a run through ``decide``/``reduce`` alone —
  no journal, no runtime — recording the history so tests can assert the exact
  event sequence and check that replay reproduces the live state.
- :class:`~mayfly.model.ids.DeterministicIdSource` makes every id predictable.
- :class:`MemoryStore` / ``memory://NAME`` is an in-memory journal, lease store
  and run index (durability ``memory``), certified by the contract suite, so a
  runtime and a :class:`~mayfly.worker.Worker` run on it.
"""

from mayfly.model.ids import DeterministicIdSource
from mayfly.testing._harness import ReducerHarness, ScriptExhausted
from mayfly.testing._memory import (
    MEMORY_CAPABILITIES,
    MemoryJournal,
    MemoryLeaseGuard,
    MemoryLeaseStore,
    MemoryStore,
    drop_store,
    memory_store,
)

__all__ = [
    "MEMORY_CAPABILITIES",
    "DeterministicIdSource",
    "MemoryJournal",
    "MemoryLeaseGuard",
    "MemoryLeaseStore",
    "MemoryStore",
    "ReducerHarness",
    "ScriptExhausted",
    "drop_store",
    "memory_store",
]
