"""``GroupCommit``: many hub tasks' appends written and flushed together, each acknowledged after its flush.

A worker drives many runs on one hub, and each run's driver appends and
waits for its commit. Flushed one by one, N runs cost N disk flushes (or N
server round trips). A backend instead hands each append to its
:class:`GroupCommit` (a hub primitive, so it lives with the hub: a backend
imports it from :mod:`mayfly.substrate`): the append is queued, a flusher task of the hub takes
every queued append at once and calls the backend's ``flush`` with all of
them on one offload thread (one write transaction, one ``fdatasync`` per
file, one round trip), then wakes each caller with its own outcome. Appends
that arrive while a flush is running wait for the next one, so the group
grows with the load; a lone append (nothing queued, nothing being flushed)
is flushed from its caller's own task, with no hop to a flusher.

The rules a backend's ``flush`` keeps (the kit cannot check them):

* each item is checked on its own (fencing token, expected sequence, event
  ids, size); a refused item gets its exception in its slot of the result
  and nothing of it is written, and it never fails the others;
* items are applied in the order given (the queue order), so two appends
  of one run stay in the order they were made;
* ``flush`` returns only once every item it reports as a success is durable
  at the journal's declared level: no caller is woken before the flush that
  covers its bytes.

Outside a hub (a plain thread, a script) ``submit`` calls ``flush`` with the
one item inline. Each hub has its own queue, so a journal shared by several
threads' hubs groups each hub's appends separately.

``flushers`` lets more than one group flush run at once (each on its own
offload thread): the filesystem's journal merges concurrent file flushes
into one commit, so the file journal runs a few. A cancelled caller whose
append was not yet taken is dropped from the queue; one whose append is
being flushed is not acknowledged (its outcome is unknown to it, as with any
interrupted append), and the others are unaffected.

Crash testing: with ``MAYFLY_TEST_KILL_AFTER_GROUP_FLUSH=N`` in the
environment, the process kills itself with ``SIGKILL`` right after the N-th
flush of two or more items returns, before any of its callers is woken
(``tests/crash`` uses it to check that recovery keeps every acknowledged
append and loses nothing that a later append built on). A backend with a
group commit of its own calls :func:`group_flushed` at the same point.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, Final, Generic, TypeVar, final

from mayfly.model.errors import HubNotRunning
from mayfly.substrate._hub import current_hub, offload, spawn
from mayfly.substrate._sync import Event

__all__ = ["GroupCommit", "group_flushed"]

I = TypeVar("I")  # noqa: E741 - the item type
R = TypeVar("R")

_MIN_SHARE: Final = 8  # with several flushers, the fewest items one takes while more are queued

KILL_AFTER_ENV: Final = "MAYFLY_TEST_KILL_AFTER_GROUP_FLUSH"
"""Test hook: SIGKILL this process after the N-th group flush (of two or more items), before its acks."""


@final
class _Waiter(Generic[I, R]):
    """One queued item, and where its outcome goes."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: I) -> None:
        self.item = item
        self.done = Event()
        self.result: R | None = None
        self.error: BaseException | None = None


@final
class _Queue:
    """One hub's queued items and how many flushers it runs now."""

    __slots__ = ("busy", "flushers", "hub", "pending")

    def __init__(self, hub: object) -> None:
        self.hub = hub
        self.pending: deque[_Waiter[Any, Any]] = deque()
        self.flushers = 0
        self.busy: set[object] = set()  # the keys of the groups being flushed now


@final
class GroupCommit(Generic[I, R]):
    """Queue appends from many hub tasks and flush them in groups (see the module docstring).

    ``flush(items)`` runs on an offload thread (by default) and returns one outcome per
    item, in order: its result, or the exception to raise in its caller.
    ``limit`` caps the items of one flush; ``flushers`` how many flushes of
    one hub may run at once. ``offload=False`` runs ``flush`` in the
    flusher task itself, for a backend whose I/O parks on the hub (sockets).
    With ``key`` (say, the item's run id), one
    group holds at most one item per key: a later item of a key already in
    the group waits for the next group, so the items of one key are
    flushed one group after another, in the order they were submitted.
    """

    __slots__ = ("_flush", "_flushers", "_key", "_limit", "_local", "_name", "_offload")

    def __init__(
        self,
        flush: Callable[[Sequence[I]], Sequence[R | BaseException]],
        *,
        name: str,
        limit: int = 512,
        flushers: int = 1,
        key: Callable[[I], object] | None = None,
        offload: bool = True,
    ) -> None:
        if limit < 1 or flushers < 1:
            raise ValueError(f"limit and flushers must be at least 1, got {limit} and {flushers}")
        self._flush = flush
        self._name = name
        self._limit = limit
        self._flushers = flushers
        self._key = key
        self._offload = offload
        self._local = threading.local()

    def submit(self, item: I) -> R:
        """Append ``item`` with the next group flush; return its result once that flush is durable."""
        try:
            hub = current_hub()
        except HubNotRunning:
            return self._one(item)
        queue = self._queue(hub)
        if not queue.flushers and self._offload:
            return self._alone(queue, item)
        waiter: _Waiter[I, R] = _Waiter(item)
        queue.pending.append(waiter)
        if queue.flushers < self._flushers:
            queue.flushers += 1
            spawn(self._run_flusher, queue, name=f"{self._name}-group-commit")
        try:
            waiter.done.wait()
        except BaseException:
            if not waiter.done.is_set():
                # Not taken yet: it is never written. Being flushed: its outcome is dropped.
                with suppress(ValueError):
                    queue.pending.remove(waiter)
            raise
        if waiter.error is not None:
            raise waiter.error
        return waiter.result  # type: ignore[return-value]

    def _alone(self, queue: _Queue, item: I) -> R:
        """Flush ``item`` from the submitting task itself: nothing is queued or being flushed.

        A lone append (a serial chain's) pays no hop to a flusher task. It
        counts as a flusher while it runs, so appends submitted meanwhile
        queue up (and start flushers of their own while the bound allows);
        whatever is still queued when it returns gets a flusher. Cancelled
        while its flush runs, the caller leaves its outcome unknown, as a
        queued caller would, and nothing else was in its group. Only for an
        offloaded flush: a cancelled caller cannot interrupt one (it runs on
        its thread to the end), while a flush that parks on the hub would be
        cut off midway.
        """
        assert self._offload
        key = None if self._key is None else self._key(item)
        queue.flushers += 1
        if key is not None:
            queue.busy.add(key)
        try:
            outcomes: Sequence[Any] = offload(self._flush, (item,))
        finally:
            queue.busy.discard(key)
            queue.flushers -= 1
            if queue.pending and queue.flushers < self._flushers:
                queue.flushers += 1
                spawn(self._run_flusher, queue, name=f"{self._name}-group-commit")
        if len(outcomes) != 1:
            raise RuntimeError(f"{self._name} flush returned {len(outcomes)} outcomes for 1 item")
        (outcome,) = outcomes
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[no-any-return]  # the flush's result for this item

    def _one(self, item: I) -> R:
        (outcome,) = self._flush((item,))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _queue(self, hub: object) -> _Queue:
        queue: _Queue | None = getattr(self._local, "queue", None)
        if queue is None or queue.hub is not hub:
            queue = self._local.queue = _Queue(hub)
        return queue

    def _run_flusher(self, queue: _Queue) -> None:
        """A flusher task: flush groups until the queue is empty."""
        try:
            while queue.pending:
                group, keys = self._take(queue)
                if not group:
                    break  # every queued key is being flushed: those flushers take them next
                if queue.pending and queue.flushers < self._flushers:
                    # More is queued than this group takes: another flusher starts on it now.
                    queue.flushers += 1
                    spawn(self._run_flusher, queue, name=f"{self._name}-group-commit")
                try:
                    items = [waiter.item for waiter in group]
                    outcomes: Sequence[Any] = (
                        offload(self._flush, items) if self._offload else self._flush(items)
                    )
                except BaseException as error:  # the flusher was cancelled or the flush itself broke
                    outcomes = [error] * len(group)
                else:
                    if len(outcomes) != len(group):
                        broken = RuntimeError(
                            f"{self._name} flush returned {len(outcomes)} outcomes for {len(group)} items"
                        )
                        outcomes = [broken] * len(group)
                    group_flushed(len(group))
                queue.busy -= keys
                for waiter, outcome in zip(group, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        waiter.error = outcome
                    else:
                        waiter.result = outcome
                    waiter.done.set()
        finally:
            queue.flushers -= 1

    def _take(self, queue: _Queue) -> tuple[list[_Waiter[Any, Any]], set[object]]:
        """The next group and its keys: queued items in order, up to ``limit``, at most one per key.

        A key already being flushed by another group is skipped too, so a
        key's items are flushed strictly one group after another.
        """
        pending = queue.pending
        # With several flushers, the queue is shared among them: a flusher takes its share.
        share = -(-len(pending) // self._flushers)
        limit = min(self._limit, max(share, _MIN_SHARE))
        keys: set[object] = set()
        if self._key is None:
            return [pending.popleft() for _ in range(min(len(pending), limit))], keys
        group: list[_Waiter[Any, Any]] = []
        kept: list[_Waiter[Any, Any]] = []
        busy = queue.busy
        while pending and len(group) < limit:
            waiter = pending.popleft()
            key = self._key(waiter.item)
            if key in keys or key in busy:
                kept.append(waiter)  # waits for a later group, still ahead of everything behind it
            else:
                keys.add(key)
                group.append(waiter)
        pending.extendleft(reversed(kept))
        busy |= keys
        return group, keys


_kill_after: int | None = None
_group_flushes = 0
_count_lock = threading.Lock()


def group_flushed(items: int) -> None:
    """Call right after a group flush of ``items`` appends is durable, before any of them is acknowledged.

    The crash-test hook point of every group commit (this kit's and a
    backend's own): with ``MAYFLY_TEST_KILL_AFTER_GROUP_FLUSH=N`` set, the
    N-th flush of two or more items in this process kills it with SIGKILL.
    Without it, this does nothing.
    """
    global _kill_after, _group_flushes  # noqa: PLW0603 - one counter per process
    if _kill_after is None:
        text = os.environ.get(KILL_AFTER_ENV, "")
        _kill_after = int(text) if text.isdigit() else 0
    if not _kill_after or items < 2:
        return
    with _count_lock:
        _group_flushes += 1
        if _group_flushes >= _kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
