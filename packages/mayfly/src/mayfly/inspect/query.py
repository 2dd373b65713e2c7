"""Run queries: list a journal's runs, filtered by state and workflow, as ``mayfly runs`` does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, final

import msgspec

from mayfly.inspect.status import WAITING, ChildStates, journal_children, run_status
from mayfly.journal import RUN_SUMMARIES, WorkflowJournal
from mayfly.model.errors import MayflyError, RunNotFound
from mayfly.model.state import RunStatus
from mayfly.plugins import PluginManager, plugin_manager
from mayfly.recovery import InspectedRun, inspect_runs

__all__ = ["RUN_STATES", "RunListing", "list_runs"]

RUN_STATES: Final = (*(status.value for status in RunStatus), WAITING)
"""The states :func:`list_runs` filters by: each run status, and ``waiting`` (running, only waiting)."""

_PAGE: Final = 1_000


@final
class RunListing(msgspec.Struct, frozen=True, omit_defaults=True):
    """One run as a listing shows it: id, workflow, state, progress and the nodes parked on a signal.

    ``status`` is the run's status word (:func:`~mayfly.inspect.run_status`):
    its terminal status, ``running``, or ``waiting`` for a running run that
    can only wait (for a signal, a backoff, a deadline or child runs that
    wait), or ``unreadable`` when its history could not be read (``error``
    then says why, and ``workflow`` is ``"?"``).
    """

    run_id: str
    workflow: str
    status: str
    nodes_done: int
    nodes: int
    waiting_on: tuple[str, ...] = ()
    error: str = ""


def list_runs(
    journal: WorkflowJournal | str,
    *,
    state: RunStatus | str | None = None,
    workflow: str | None = None,
    limit: int = 100,
    plugins: PluginManager | None = None,
) -> list[RunListing]:
    """Up to ``limit`` runs of ``journal``, in the state ``state`` and of workflow id ``workflow`` if given.

    ``journal`` is a journal or its URL (opened through ``plugins``), and
    ``plugins`` the plugin context whose event upcasters read each history
    (default: the process's entry-point manager). ``state`` is a
    :class:`~mayfly.model.state.RunStatus`, its value, or ``"waiting"`` (see
    :func:`~mayfly.inspect.run_status`); a
    ``running`` filter includes the waiting runs. Without filters, a run whose
    history cannot be read is listed as ``unreadable`` rather than hiding
    every other run. A journal that keeps
    an indexed run summary lists the most recently updated runs first, in
    O(``limit``) reads; others are paged through in run id order.
    """
    wanted = _state(state)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    plugins = plugin_manager() if plugins is None else plugins
    if isinstance(journal, str):
        journal = plugins.open_journal(journal)
    upcasters = plugins.event_upcasters()
    filtered = wanted is not None or workflow is not None
    rows: list[RunListing] = []
    children = journal_children(journal, upcasters)
    for page in _candidate_pages(journal, wanted, workflow, limit):
        position = 0
        while position < len(page):
            # Runs are inspected a chunk at a time (one query on a journal with run_tails): unfiltered,
            # exactly the runs still needed; filtered, up to a listing's worth.
            size = limit if filtered else limit - len(rows)
            chunk = page[position : position + size]
            position += size
            for run_id, found in zip(chunk, inspect_runs(journal, chunk, upcasters=upcasters), strict=True):
                if isinstance(found, RunNotFound):
                    continue  # purged since it was listed
                row = _listing(run_id, found, children)
                if row.status == "unreadable":
                    if not filtered:
                        rows.append(row)
                elif _matches(row, wanted) and (
                    workflow is None or row.workflow.rpartition("@")[0] == workflow
                ):
                    rows.append(row)
                if len(rows) >= limit:
                    return rows
    return rows


def _state(state: RunStatus | str | None) -> str | None:
    if state is None:
        return None
    value = state.value if isinstance(state, RunStatus) else state
    if value not in RUN_STATES:
        raise ValueError(f"state must be one of {', '.join(RUN_STATES)}, got {state!r}")
    return value


def _matches(row: RunListing, state: str | None) -> bool:
    # A waiting run is listed as waiting, and is still a running run.
    if state is None or row.status == state:
        return True
    return state == RunStatus.RUNNING.value and row.status == WAITING


def _listing(run_id: str, inspected: InspectedRun, children: ChildStates) -> RunListing:
    if isinstance(inspected, MayflyError):
        # One unreadable history must not hide every other run; `mayfly inspect` explains it.
        return RunListing(run_id, "?", "unreadable", 0, 0, error=str(inspected))
    state = inspected.state
    waiting = tuple(node.node_id for node in state.nodes if node.wait is not None)
    return RunListing(
        run_id=run_id,
        workflow=f"{state.spec.workflow_id}@{state.spec.version}",
        status=run_status(state, children),
        nodes_done=len(state.nodes) - state.open_nodes,
        nodes=len(state.nodes),
        waiting_on=waiting,
    )


def _candidate_pages(
    journal: WorkflowJournal, state: str | None, workflow: str | None, limit: int
) -> Iterator[list[str]]:
    """Pages of run ids to read for a listing.

    A backend that keeps an indexed run summary (``run_summaries``, e.g.
    PostgreSQL) preselects the most recently updated runs matching the
    filters. "waiting" is not a run status (it is a running run that only
    waits), so it always pages through the runs.
    """
    summaries = RUN_SUMMARIES.of(journal)
    if summaries is not None and state != WAITING:
        found = summaries.run_summaries(status=state, workflow_id=workflow, limit=min(limit, _PAGE))
        yield [summary.run_id for summary in found]
        return
    after = None
    while True:
        page = journal.list_runs(after=after, limit=min(_PAGE, limit * 4))
        if not page:
            return
        after = page[-1]
        yield page
