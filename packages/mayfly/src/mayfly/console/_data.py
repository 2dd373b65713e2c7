"""What the console's pages show, read through the library's payload-free inspection paths.

The run list pages with a keyset cursor, never an offset: on a journal with
an indexed run summary (``run_summaries``, PostgreSQL) it walks the index
newest first, O(page) rows a page; elsewhere it walks run ids in order.
Filters the index cannot apply (``waiting``, the queue) are applied to the
rows read, scanning at most :data:`MAX_SCAN` candidates a page. The runs of a
page are inspected together (:func:`mayfly.recovery.inspect_runs`): on a
journal with ``run_tails`` (PostgreSQL) that is one query for the whole page,
not two reads per run. Every row is a :class:`~mayfly.inspect.RunListing`-like
summary of the run's state: nothing of its input, outputs or signals.
"""

from __future__ import annotations

import datetime
import itertools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from mayfly.inspect import WAITING, ChildStates, journal_children, narrate, run_status
from mayfly.journal import RUN_SUMMARIES, WorkflowJournal
from mayfly.lease import LEASE_LISTING, LeaseInfo, RecoveryLeaseStore
from mayfly.model.errors import MayflyError, RunNotFound
from mayfly.model.state import RunStatus
from mayfly.queues import QUEUE_CONTROL, QueueSettings, QueueUsage
from mayfly.recovery import InspectedRun, inspect_runs
from mayfly.reducer import Upcaster, decode_event
from mayfly.runindex import RUN_INDEX, IndexEntry

__all__ = [
    "LEASE_PAGE",
    "MAX_SCAN",
    "HistoryLine",
    "HistoryPage",
    "LeasePage",
    "QueueRow",
    "RunPage",
    "RunRow",
    "WorkersView",
    "history_page",
    "lease_page",
    "list_page",
    "workers_view",
]

MAX_SCAN: Final = 2_000
"""The most candidate runs one page of a filtered list reads before it offers the next page."""

HISTORY_PAGE: Final = 100
"""History lines on one page of a run's timeline."""

WORKERS_SCAN: Final = 5_000
"""The most runs the workers and queues page reads the index entries of."""

LEASE_PAGE: Final = 100
"""Live leases on one page of the workers page."""


class BadCursor(ValueError):
    """A ``cursor`` that this console did not hand out."""


@dataclass(frozen=True)
class RunRow:
    """One run of the list: id, workflow, status word, queue, progress and what it waits on."""

    run_id: str
    workflow: str
    status: str
    queue: str = ""
    nodes_done: int = 0
    nodes: int = 0
    waiting_on: tuple[str, ...] = ()
    parent: str | None = None
    updated: str = ""
    error: str = ""


@dataclass(frozen=True)
class RunPage:
    """One page of the run list and the cursor of the next (``None``: no more runs)."""

    rows: list[RunRow]
    next_cursor: str | None
    scanned: int
    ordering: str


def _parse_cursor(cursor: str | None, indexed: bool) -> tuple[datetime.datetime | None, int, str | None]:
    if not cursor:
        return None, 0, None
    kind, _, rest = cursor.partition("~")
    try:
        if indexed and kind == "t":
            stamp, _, skip = rest.rpartition("~")
            return datetime.datetime.fromisoformat(stamp), int(skip), None
        if not indexed and kind == "r" and rest:
            return None, 0, rest
    except ValueError:
        pass
    raise BadCursor(f"cursor {cursor[:80]!r} was not handed out by this console; start from the first page")


def _candidates(
    journal: WorkflowJournal, state: str | None, workflow: str | None, cursor: str | None, batch: int
) -> Iterator[tuple[str, str, str]]:
    """(run id, updated text, the cursor that resumes *after* this candidate), in list order."""
    summaries = RUN_SUMMARIES.of(journal)
    if summaries is not None:
        before, skip, _ = _parse_cursor(cursor, True)
        status = RunStatus.RUNNING.value if state == WAITING else state
        while True:
            # updated_at moves in whole steps, so many runs can share one: the cursor says how many
            # runs at its timestamp were listed, and the next page skips them (a keyset, not an offset).
            bound = None if before is None else before + datetime.timedelta(microseconds=1)
            asked = min(batch + skip, 100_000)
            found = summaries.run_summaries(
                status=status, workflow_id=workflow, updated_before=bound, limit=asked
            )
            rows = found[skip:] if before is not None else found
            if not rows:
                return
            for row in rows:
                if row.updated_at == before:
                    skip += 1
                else:
                    before, skip = row.updated_at, 1
                yield (
                    row.run_id,
                    row.updated_at.isoformat(timespec="seconds"),
                    f"t~{before.isoformat()}~{skip}",
                )
            if len(found) < asked:
                return
    else:
        _, _, after = _parse_cursor(cursor, False)
        while True:
            page = journal.list_runs(after=after, limit=batch)
            for run_id in page:
                yield run_id, "", f"r~{run_id}"
            if len(page) < batch:
                return
            after = page[-1]


def _row(run_id: str, updated: str, inspected: InspectedRun, children: ChildStates) -> RunRow:
    if isinstance(inspected, MayflyError):
        return RunRow(run_id, "?", "unreadable", updated=updated, error=str(inspected))
    state = inspected.state
    return RunRow(
        run_id=run_id,
        workflow=f"{state.spec.workflow_id}@{state.spec.version}",
        status=run_status(state, children),
        queue=state.queue,
        nodes_done=len(state.nodes) - state.open_nodes,
        nodes=len(state.nodes),
        waiting_on=tuple(node.node_id for node in state.nodes if node.wait is not None),
        parent=None if state.parent is None else state.parent.run_id,
        updated=updated,
    )


def list_page(
    journal: WorkflowJournal,
    upcasters: Mapping[tuple[str, int], Upcaster],
    *,
    state: str | None = None,
    workflow: str | None = None,
    queue: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> RunPage:
    """One page of runs matching the filters, from ``cursor`` (``None``: the first page).

    Candidates are inspected a chunk at a time: unfiltered, exactly the runs
    the page still needs (every one is listed); filtered, up to a page's
    worth, of which those past a full page are not consumed (the next page's
    cursor starts after the last run consumed, so they are read again there).
    """
    indexed = RUN_SUMMARIES.of(journal) is not None
    children = journal_children(journal, upcasters)
    filtered = state is not None or workflow is not None or queue is not None
    rows: list[RunRow] = []
    scanned = 0
    last: str | None = None
    candidates = iter(_candidates(journal, state, workflow, cursor, min(4 * limit, 1_000)))
    held: list[tuple[str, str, str]] = []  # read ahead, not consumed
    while True:
        if len(rows) >= limit or scanned >= MAX_SCAN:
            more = bool(held) or next(candidates, None) is not None
            return RunPage(rows, last if more else None, scanned, _ordering(indexed))
        size = min(limit if filtered else limit - len(rows), MAX_SCAN - scanned)
        chunk = held[:size]
        del held[:size]
        chunk.extend(itertools.islice(candidates, size - len(chunk)))
        if not chunk:
            return RunPage(rows, None, scanned, _ordering(indexed))
        inspected = inspect_runs(journal, [run_id for run_id, _, _ in chunk], upcasters=upcasters)
        for offset, ((run_id, updated, resume), found) in enumerate(zip(chunk, inspected, strict=True)):
            if len(rows) >= limit:
                held[:0] = chunk[offset:]
                break
            scanned += 1
            last = resume
            if isinstance(found, RunNotFound):
                continue  # purged since the index listed it
            row = _row(run_id, updated, found, children)
            if _listed(row, filtered, state, workflow, queue):
                rows.append(row)


def _listed(row: RunRow, filtered: bool, state: str | None, workflow: str | None, queue: str | None) -> bool:
    """Whether the list shows ``row`` under the filters (an unreadable run only without filters)."""
    if row.status == "unreadable":
        return not filtered
    # A waiting run is listed as waiting, and is still a running run.
    running = state == RunStatus.RUNNING.value and row.status == WAITING
    if state is not None and row.status != state and not running:
        return False
    if workflow is not None and row.workflow.rpartition("@")[0] != workflow:
        return False
    return queue is None or row.queue == queue


def _ordering(indexed: bool) -> str:
    return "most recently updated first" if indexed else "in run id order (oldest first)"


@dataclass(frozen=True)
class HistoryLine:
    """One event of a run's timeline: its sequence, type, subject and payload-free narration."""

    sequence: int
    event_type: str
    subject: str
    text: str


@dataclass(frozen=True)
class HistoryPage:
    """One page of a run's timeline, the sequence to start the next page after, and the run's last one."""

    lines: list[HistoryLine]
    after: int
    next_after: int | None
    last_sequence: int


def history_page(
    journal: WorkflowJournal,
    run_id: str,
    upcasters: Mapping[tuple[str, int], Upcaster],
    *,
    after: int = 0,
    limit: int = HISTORY_PAGE,
) -> HistoryPage:
    """The events of ``run_id`` after sequence ``after``, narrated (``RunNotFound`` for an unknown run)."""
    last = journal.next_sequence(run_id) - 1
    if last < 1:
        raise RunNotFound(run_id)
    records = journal.read(run_id, after=after, limit=limit)
    lines = []
    for record in records:
        event = decode_event(record.event_type, record.schema_version, record.payload, upcasters=upcasters)
        told = narrate(event)
        lines.append(HistoryLine(record.sequence, type(event).__name__, told.subject or "", told.text))
    end = records[-1].sequence if records else after
    return HistoryPage(lines, after, end if end < last else None, last)


@dataclass(frozen=True)
class QueueRow:
    """One queue: its flow-control settings (if any), usage, and the runs the index holds by status."""

    name: str
    settings: QueueSettings | None
    usage: QueueUsage | None
    by_status: dict[str, int] = field(default_factory=dict)
    due: int = 0


@dataclass(frozen=True)
class ClaimedRun:
    """A root run a worker has claimed (its entry has a first-claim time) that has not ended."""

    run_id: str
    queue: str
    status: str
    started_ms: int | None
    ready_at_ms: int | None
    wake: bool


@dataclass(frozen=True)
class WorkersView:
    """The workers and queues page: per-queue depth and limits, and the runs in progress."""

    queues: list[QueueRow]
    in_progress: list[ClaimedRun]
    scanned: int
    complete: bool
    index: bool
    queue_control: bool
    now_ms: int


def workers_view(journal: WorkflowJournal) -> WorkersView:
    """Queue depth by index status, queue limits and usage, and the claimed runs, as the index says."""
    now = time.time_ns() // 1_000_000
    control = QUEUE_CONTROL.of(journal)
    index = RUN_INDEX.of(journal)
    queues: dict[str, QueueRow] = {}
    if control is not None:
        for settings in control.queue_list():
            queues[settings.name] = QueueRow(
                settings.name, settings, control.queue_usage(settings.name, now_ms=now)
            )
    claimed: list[ClaimedRun] = []
    scanned = 0
    complete = True
    if index is not None:
        after = None
        while True:
            page = journal.list_runs(after=after, limit=1_000)
            for run_id in page:
                if scanned >= WORKERS_SCAN:
                    complete = False
                    break
                scanned += 1
                entry: IndexEntry | None = index.index_get(run_id)
                if entry is None:
                    continue
                row = queues.get(entry.queue)
                if row is None:
                    usage = None if control is None else control.queue_usage(entry.queue, now_ms=now)
                    row = queues[entry.queue] = QueueRow(entry.queue, None, usage)
                status = entry.status.value
                row.by_status[status] = row.by_status.get(status, 0) + 1
                if status == "waiting" and (entry.wake or (entry.ready_at_ms or now + 1) <= now):
                    queues[entry.queue] = QueueRow(
                        row.name, row.settings, row.usage, row.by_status, row.due + 1
                    )
                if entry.started_ms is not None and status != "terminal" and entry.parent is None:
                    claimed.append(
                        ClaimedRun(
                            run_id, entry.queue, status, entry.started_ms, entry.ready_at_ms, entry.wake
                        )
                    )
            if not complete or len(page) < 1_000:
                break
            after = page[-1]
    return WorkersView(
        queues=sorted(queues.values(), key=lambda row: row.name),
        in_progress=claimed,
        scanned=scanned,
        complete=complete,
        index=index is not None,
        queue_control=control is not None,
        now_ms=now,
    )


@dataclass(frozen=True)
class LeasePage:
    """One page of the live leases (run id order) after ``after``, and the ``after`` of the next page.

    ``listed`` is false when the lease store does not declare ``lease_listing``
    (then ``leases`` is empty: who holds what cannot be told).
    """

    leases: list[LeaseInfo]
    after: str | None
    next_after: str | None
    listed: bool


def lease_page(leases: RecoveryLeaseStore, *, after: str | None = None, limit: int = LEASE_PAGE) -> LeasePage:
    """The live leases after ``after``, through the store's ``lease_listing`` feature (one bounded read).

    Owners are what the holders passed to ``acquire`` (worker ids), never
    anything of a run's input or output.
    """
    listing = LEASE_LISTING.of(leases)
    if listing is None:
        return LeasePage([], after, None, listed=False)
    found = listing.list_leases(after=after, limit=limit + 1)
    more = len(found) > limit
    shown = found[:limit]
    return LeasePage(shown, after, shown[-1].run_id if more else None, listed=True)
