"""Pytest fixtures for testing workflows, registered as the ``mayfly`` pytest11 plugin of ``mayfly-runtime``.

- ``mayfly_registry``: the :class:`~mayfly.HandlerRegistry` the other fixtures
  use; empty by default. Override it in a ``conftest.py`` to return your
  application's registry, or register handlers on it in the test.
- ``mayfly_env``: a :class:`~mayfly.testing.WorkflowTestEnv` on that registry,
  closed (its store dropped) when the test ends.
- ``mayfly_clock``: the env's :class:`~mayfly.substrate.VirtualClock`.
- ``mayfly_runtime``: the env's :class:`~mayfly.WorkflowRuntime`.
- ``mayfly_memory_journal``: the env's in-memory journal (``memory://``).

Every fixture is function-scoped: each test gets a fresh store and a clock at
virtual time 0. The names never clash with the contract suite's fixtures
(``mayfly_journal``, ``mayfly_leases``...), so both plugins load side by side.
Mayfly is imported only when a fixture is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from mayfly.runtime import HandlerRegistry, WorkflowRuntime
    from mayfly.substrate import VirtualClock
    from mayfly.testing import MemoryJournal, WorkflowTestEnv

__all__ = ["mayfly_clock", "mayfly_env", "mayfly_memory_journal", "mayfly_registry", "mayfly_runtime"]


@pytest.fixture
def mayfly_registry() -> HandlerRegistry:
    """The handler registry of ``mayfly_env`` (empty; override it to return your application's)."""
    from mayfly.runtime import HandlerRegistry  # noqa: PLC0415  # lazy: a plugin-time import would hide mayfly from coverage

    return HandlerRegistry()


@pytest.fixture
def mayfly_env(mayfly_registry: HandlerRegistry) -> Iterator[WorkflowTestEnv]:
    """A WorkflowTestEnv on a fresh in-memory store and a virtual clock at 0, closed after the test."""
    from mayfly.testing import WorkflowTestEnv  # noqa: PLC0415  # lazy, as above

    with WorkflowTestEnv(mayfly_registry) as env:
        yield env


@pytest.fixture
def mayfly_clock(mayfly_env: WorkflowTestEnv) -> VirtualClock:
    """The virtual clock of ``mayfly_env``."""
    return mayfly_env.clock


@pytest.fixture
def mayfly_runtime(mayfly_env: WorkflowTestEnv) -> WorkflowRuntime:
    """The runtime of ``mayfly_env`` (replaced by a new one after a simulated crash: read it afresh)."""
    return mayfly_env.runtime


@pytest.fixture
def mayfly_memory_journal(mayfly_env: WorkflowTestEnv) -> MemoryJournal:
    """The in-memory journal of ``mayfly_env``."""
    return mayfly_env.journal
