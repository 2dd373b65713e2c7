"""The run's status word, the one every listing, inspection and CLI command shows.

A run's recorded status is ``running`` until it ends. Operators also need to
know whether a running run is doing something or only waiting, so the word
is ``waiting`` for a running run that can only wait: for a signal, for a
retry's backoff or a deadline (what the run index calls ``waiting``, see
:func:`mayfly.runindex.index_entry`), or for child runs that themselves wait.
``waiting`` is not a :class:`~mayfly.model.state.RunStatus`: a waiting run is
a running one, and resuming it (or a worker) carries it on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from mayfly.journal import WorkflowJournal
from mayfly.model.errors import CompatibilityError, CorruptionError, JournalError, RunNotFound
from mayfly.model.state import RunState
from mayfly.recovery import inspect_run
from mayfly.reducer import Upcaster
from mayfly.runindex import IndexStatus, index_entry

__all__ = ["WAITING", "ChildStates", "journal_children", "run_status", "wake_at_ms"]

WAITING: Final = "waiting"
"""The status word of a running run that can only wait (see the module docstring)."""

ChildStates = Callable[[str], RunState | None]
"""Reads a child run's state by id (``None`` when it cannot be read or does not exist yet)."""


def run_status(state: RunState, children: ChildStates | None = None) -> str:
    """The run's status word: its terminal status, ``waiting``, or ``running``.

    ``waiting`` when nothing is ready and no attempt is executing: every
    attempt in flight waits for a signal, and any other open work waits for a
    timer (a retry's backoff, a deadline). With ``children`` (see
    :func:`journal_children`) an attempt calling a child run also counts as
    waiting when that child run is ``waiting``, at any depth; without it, such
    a run is ``running``. A run created but never driven is ``running``.
    """
    if state.status.is_terminal:
        return state.status.value
    if index_entry(state).status is IndexStatus.WAITING:
        return WAITING
    if children is None or state.has_ready or not state.active_count:
        return state.status.value
    return WAITING if _children_wait(state, children) else state.status.value


def _children_wait(state: RunState, children: ChildStates) -> bool:
    # Every attempt in flight waits: on a signal, or in a child run that waits.
    for attempt_id, index in state.active_attempts():
        if state.node(index).wait is not None:
            continue
        record = state.attempt(attempt_id)
        if record is None or record.child_run_id is None:
            return False
        child = children(record.child_run_id)
        if child is None or run_status(child, children) != WAITING:
            return False
    return True


def wake_at_ms(state: RunState) -> int | None:
    """When a waiting run next falls due by itself (wall-clock Unix ms), or ``None`` if only a signal ends it.

    The run index's wake time (:func:`mayfly.runindex.index_entry`): the
    earliest retry release, attempt or wait deadline, or elapsed budget.
    ``None`` too for a run that is not waiting.
    """
    entry = index_entry(state)
    return entry.ready_at_ms if entry.status is IndexStatus.WAITING else None


def journal_children(
    journal: WorkflowJournal, upcasters: Mapping[tuple[str, int], Upcaster] | None = None
) -> ChildStates:
    """A :data:`ChildStates` reading child runs from ``journal`` (through ``upcasters``)."""

    def read(run_id: str) -> RunState | None:
        try:
            return inspect_run(journal, run_id, upcasters=upcasters).state
        except (RunNotFound, JournalError, CorruptionError, CompatibilityError):
            # Not created yet (it starts when its parent is driven), or unreadable: not known to wait.
            return None

    return read
