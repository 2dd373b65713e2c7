"""Helpers for testing workflows and Mayfly itself; shipped so users can test their own workflows.

- :class:`ReducerHarness` drives a run through ``decide``/``reduce`` alone —
  no journal, no runtime — recording the history so tests can assert the exact
  event sequence and check that replay reproduces the live state.
- :class:`~mayfly.model.ids.DeterministicIdSource` makes every id predictable.
- :class:`MemoryStore` / ``memory://NAME`` is an in-memory journal, lease store
  and run index (durability ``memory``), certified by the contract suite, so a
  runtime and a :class:`~mayfly.worker.Worker` run on it.
- :class:`WorkflowTestEnv` runs workflows on a memory store and a virtual
  clock: backoffs and deadlines fire at once, a test acts at a chosen virtual
  time (:meth:`~WorkflowTestEnv.advance`, :meth:`~WorkflowTestEnv.signal`),
  crashes a drive after a chosen event and reads the decoded history
  (:func:`assert_events`). ``docs/testing.md`` walks through it.
- The simulator's core (:func:`generate_workflow`, :class:`FaultJournal`,
  :class:`SimDriver`, :func:`check_invariants`) drives seeded workflows
  through simulated process deaths and clock faults on any journal, and
  reports broken guarantees as :class:`Violation` values;
  :func:`simulate` runs a user's own workflow that way.
"""

from mayfly.model.ids import DeterministicIdSource
from mayfly.testing._env import EventPattern, SimulatedCrash, WorkflowTestEnv, assert_events
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
from mayfly.testing._sim import (
    EffectLog,
    ExpectedRun,
    FaultJournal,
    FaultPlan,
    GeneratedWorkflow,
    Invocation,
    SimDriver,
    SimEvent,
    Violation,
    check_invariants,
    expected_of,
    generate_workflow,
    sim_registry,
)
from mayfly.testing._simulate import SeedFailure, SimulationReport, simulate

__all__ = [
    "MEMORY_CAPABILITIES",
    "DeterministicIdSource",
    "EffectLog",
    "EventPattern",
    "ExpectedRun",
    "FaultJournal",
    "FaultPlan",
    "GeneratedWorkflow",
    "Invocation",
    "MemoryJournal",
    "MemoryLeaseGuard",
    "MemoryLeaseStore",
    "MemoryStore",
    "ReducerHarness",
    "ScriptExhausted",
    "SeedFailure",
    "SimDriver",
    "SimEvent",
    "SimulatedCrash",
    "SimulationReport",
    "Violation",
    "WorkflowTestEnv",
    "assert_events",
    "check_invariants",
    "drop_store",
    "expected_of",
    "generate_workflow",
    "memory_store",
    "sim_registry",
    "simulate",
]
