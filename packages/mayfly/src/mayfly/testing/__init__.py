"""Helpers for testing workflows and Mayfly itself; shipped so users can test their own workflows.

- :class:`ReducerHarness` drives a run through ``decide``/``reduce`` alone —
  no journal, no runtime — recording the history so tests can assert the exact
  event sequence and check that replay reproduces the live state.
- :class:`~mayfly.model.ids.DeterministicIdSource` makes every id predictable.
"""

from mayfly.model.ids import DeterministicIdSource
from mayfly.testing._harness import ReducerHarness, ScriptExhausted

__all__ = ["DeterministicIdSource", "ReducerHarness", "ScriptExhausted"]
