"""One LMDB environment per directory and process, its transactions, map growth and error mapping.

LMDB forbids opening one environment twice in a process (its fcntl locks
belong to the process, so closing a second handle would drop the first one's
locks), so every journal and lease store of a directory shares one
:class:`SharedEnv`, reference-counted, and a forked child opens its own.

Transactions never span a greenlet switch: :meth:`SharedEnv.write` and
:meth:`SharedEnv.read` run a plain function inside one transaction and end
it before returning, and that function only calls LMDB. So a hub task can
never park while it holds LMDB's writer lock, and a second task of the same
hub can never deadlock waiting for it.

Group commit. A durable commit waits for the disk, and LMDB has one writer
per environment, so writes committed one by one queue behind one flush at a
time. :meth:`SharedEnv.write` instead queues its function and the first
waiting thread becomes the *leader*: it takes LMDB's writer lock, then every
function queued by then (many runs' appends, lease grants, index writes),
runs each in a nested transaction of one write transaction — a function
that raises aborts only its own nested transaction, so it writes nothing —
and commits them with one sync. Each caller gets its result only after that
commit; only the threads whose writes it covered are woken, and leadership
passes to the oldest waiting write's thread.

From a hub task (ADR-0033: a flush never blocks the hub) a write joins its
hub's open *batch*: the task that opens one lets every other ready task of
the hub run once, so that their writes join it, then carries the whole batch
to the group commit in one :func:`mayfly.substrate.offload` and wakes the
batch's tasks when it is done. The hub keeps running meanwhile, pays one
thread hand-off per batch rather than per write, and the next batch forms
while this one syncs.

Map size. A write that fills the map is aborted (nothing of it is
committed), the map is grown and the whole transaction is retried; a record
is acknowledged only after the commit that holds it. Growing needs every
transaction of the process to be finished, so transactions pass a gate that
a resize closes. When another process grew the map beyond this process's
mapping, LMDB reports ``MAP_RESIZED`` and the new size is adopted the same
way. Past ``max_map_size`` the write fails with :class:`LmdbMapFull`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar, final

import lmdb

from mayfly.backend import VOLATILE_FILESYSTEMS, filesystem_type
from mayfly.errors import (
    CompatibilityError,
    CorruptionError,
    DurabilityUnavailable,
    InvalidBackendURL,
    JournalUnavailable,
    LimitExceeded,
    MayflyError,
)
from mayfly.substrate import Event, Hub, HubNotRunning, checkpoint, current_hub, group_flushed, offload
from mayfly_lmdb._codec import FORMAT
from mayfly_lmdb._url import LmdbTarget, format_size

__all__ = ["LmdbMapFull", "SharedEnv", "acquire_env", "filesystem_type", "off_hub"]

_T = TypeVar("_T")
_DATABASES: Final = (
    b"records",
    b"events",
    b"heads",
    b"snapshots",
    b"runs",
    b"leases",
    b"meta",
    b"index",
    b"claims",
    b"timers",
    b"waits",
    b"queues",
    b"qruns",
    b"dedup",
    b"starts",
    b"schedules",
)
# The run index (mayfly_lmdb._index) and queue flow control (mayfly_lmdb._queues) came after format 1's
# first release: a read-only handle on an environment written before them finds these absent and sees
# an empty index and no queue settings.
_OPTIONAL: Final = frozenset(
    {b"index", b"claims", b"timers", b"waits", b"queues", b"qruns", b"dedup", b"starts", b"schedules"}
)
_GROUP_LIMIT: Final = 512  # the most writes one group commit takes
_OPEN_ATTEMPTS: Final = 20
_MAX_READERS: Final = 512
_MIN_GROWTH: Final = 8 << 20
_CORRUPT: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.PanicError,
    lmdb.BadChecksumError,
)
_INCOMPATIBLE: Final = (lmdb.VersionMismatchError, lmdb.IncompatibleError, lmdb.InvalidError)


def off_hub(fn: Callable[..., _T], *args: object) -> _T:
    """Run ``fn(*args)``, a call that may wait for the disk or LMDB's writer lock: offloaded from a hub task.

    The calling task parks while an offload thread waits, and the hub runs
    every other task meanwhile (ADR-0033). Outside a hub (or on an offload
    thread already) the call runs inline.
    """
    try:
        current_hub()
    except HubNotRunning:
        return fn(*args)
    return offload(fn, *args)


@final
class _Write:
    """One queued write: its function, its operation name, and, once its group committed, the outcome."""

    __slots__ = ("body", "done", "error", "operation", "result", "shared", "waiter")

    def __init__(self, body: Callable[[lmdb.Transaction[bytes]], Any], operation: str) -> None:
        self.body = body
        self.operation = operation
        self.result: Any = None
        self.error: BaseException | None = None
        self.shared = False  # the error is the whole group's: raised without the leader's traceback
        self.done = False
        self.waiter: _Waiter | None = None

    def outcome(self) -> Any:
        """The body's result, or its error raised."""
        error = self.error
        if error is not None:
            # One error object failing a whole group is raised by every waiter: drop the traceback it
            # collected elsewhere, so tracebacks do not pile up from thread to thread.
            raise error.with_traceback(None) if self.shared else error
        return self.result


@final
class _Waiter:
    """The thread waiting for some queued writes: woken when they are all done, or to lead the next group."""

    __slots__ = ("event", "promoted", "remaining")

    def __init__(self, count: int) -> None:
        self.event = threading.Event()
        self.remaining = count
        self.promoted = False


@final
class _HubBatch:
    """Writes of one hub's tasks submitted together: one offload carries them all to the group commit."""

    __slots__ = ("event", "finished", "hub", "orphaned", "submitted", "writes")

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.writes: list[_Write] = []
        self.event = Event()  # set on the hub once every write is done (or the batch needs a new owner)
        self.finished = threading.Event()  # set by the offload thread once every write is done
        self.submitted = False
        self.orphaned = False  # its owner task was cancelled: the next member to wake takes it over


class LmdbMapFull(LimitExceeded):
    """The environment reached ``max_map_size``; nothing of the failed write was committed."""

    def __init__(self, path: str, operation: str, map_size: int, max_map_size: int) -> None:
        self.what = f"LMDB map of {path}"
        self.limit = max_map_size
        self.observed = map_size
        self.unit = "bytes"
        self.path = path
        MayflyError.__init__(
            self,
            f"{operation} did not fit: the LMDB map of {path} is full at max_map_size="
            f"{format_size(max_map_size)}; nothing was written. Raise max_map_size in the journal "
            "URL (e.g. ?max_map_size=4TiB) or free disk space, then retry",
        )


def map_error(error: lmdb.Error, path: str, operation: str) -> MayflyError:
    """Translate a driver error into the core hierarchy; the message names path and operation."""
    detail = f"{type(error).__name__}: {error}"
    if isinstance(error, _CORRUPT):
        return CorruptionError(
            f"{operation}: the LMDB environment {path} is corrupt ({detail}); restore it from a "
            "backup made with mdb_copy"
        )
    if isinstance(error, _INCOMPATIBLE):
        return CompatibilityError(
            f"{operation}: {path} is not an LMDB environment this lmdb {lmdb.__version__} can read ({detail})"
        )
    if isinstance(error, lmdb.ReadersFullError):
        return JournalUnavailable(
            f"{operation}: every reader slot of {path} is taken ({detail}); stop idle processes "
            "or run `mdb_stat -rr` to clear readers of dead ones, then retry"
        )
    return JournalUnavailable(f"{operation} failed on LMDB environment {path}: {detail}; retry")


@final
class SharedEnv:
    """The process's handle on one environment directory: the LMDB env, its databases and its gate."""

    def __init__(self, target: LmdbTarget) -> None:
        self.path = str(target.path)
        self.sync = target.sync
        self.readonly = target.readonly
        self.max_map_size = target.max_map_size
        self.pid = os.getpid()
        self.references = 0
        # Transactions take the bare lock (cheap, C-level); only waits use the condition.
        self._lock = threading.Lock()
        self._gate = threading.Condition(self._lock)
        self._active = 0
        self._resizing = False
        self._generation = 0
        # Group commit: writes queued for the next leader, and whether a leader is at work.
        self._queue = threading.Lock()
        self._pending: list[_Write] = []
        self._leading = False
        self.locked_here: dict[bytes, int] = {}
        """Run key -> token of each lease grant whose file lock a guard of this process holds."""
        # The open batch of each hub (by id; the batch names its hub), touched only on that hub's thread.
        self._hub_open: dict[int, _HubBatch] = {}
        self.commits = 0
        """Write transactions committed by this process (one per group)."""
        self.writes = 0
        """Writes committed by this process (``writes / commits`` is the mean group size)."""
        if target.sync and not target.readonly:
            fstype = filesystem_type(target.path if target.path.exists() else target.path.parent)
            if fstype in VOLATILE_FILESYSTEMS:
                raise DurabilityUnavailable(
                    f"lmdb environment {self.path} is on {fstype}, which does not survive a host "
                    "crash, so durability=sync cannot be met; put it on a disk, or choose "
                    "?durability=nosync explicitly"
                )
        try:
            if not target.readonly:
                target.path.mkdir(parents=True, exist_ok=True)
            for attempt in range(_OPEN_ATTEMPTS):
                try:
                    self.env = lmdb.open(
                        self.path,
                        map_size=target.map_size,
                        subdir=True,
                        readonly=target.readonly,
                        create=not target.readonly,
                        sync=target.sync,
                        metasync=True,
                        lock=True,
                        max_dbs=len(_DATABASES),
                        max_readers=_MAX_READERS,
                        mode=0o644,
                    )
                    break
                except lmdb.MapResizedError:
                    # Another process grew the map between opening and the first transaction; a new
                    # open reads the grown size from the meta page.
                    if attempt == _OPEN_ATTEMPTS - 1:
                        raise
        except lmdb.Error as error:
            raise map_error(error, self.path, "opening the journal") from None
        except OSError as error:
            raise JournalUnavailable(f"cannot open lmdb environment {self.path}: {error}") from None
        try:
            flags = self.env.flags()
            if target.sync and not target.readonly and not (flags["sync"] and flags["metasync"]):
                raise DurabilityUnavailable(
                    f"lmdb environment {self.path} did not enable synchronous commits; "
                    "refusing to acknowledge appends as durable"
                )
            # Reader slots left by killed processes pin old pages and fill the reader table.
            self.env.reader_check()
            self._open_databases(target.readonly)
        except lmdb.Error as error:
            self.env.close()
            raise map_error(error, self.path, "opening the journal") from None
        except BaseException:
            self.env.close()
            raise

    def _open_databases(self, readonly: bool) -> None:
        try:
            while True:
                try:
                    with self.env.begin() as txn:
                        names = {key for key, _ in txn.cursor()}
                    break
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)
            foreign = sorted(names - set(_DATABASES))
            if foreign:
                # Never add Mayfly's databases to an environment another program owns.
                raise CompatibilityError(
                    f"{self.path} is an LMDB environment of another program (its main database "
                    f"holds {foreign[:3]!r}); point the journal at a directory of its own"
                )
            while True:
                try:
                    handles = [self.env.open_db(name, create=not readonly) for name in _DATABASES[:7]]
                    optional = [self._open_db(name, readonly, name in names) for name in _DATABASES[7:]]
                    break
                except lmdb.MapResizedError:
                    # Another process grew the map past the size asked for here: adopt its size.
                    self.env.set_mapsize(0)
        except lmdb.NotFoundError:
            raise JournalUnavailable(
                f"{self.path} holds no Mayfly journal yet; open it once without readonly=true"
            ) from None
        except lmdb.Error as error:
            raise map_error(error, self.path, "opening the journal databases") from None
        (self.records, self.events, self.heads, self.snapshots, self.runs, self.leases, self.meta) = handles
        (
            self.index,
            self.claims,
            self.timers,
            self.waits,
            self.queues,
            self.qruns,
            self.dedup,
            self.starts,
            self.schedules,  # stored schedules (mayfly_lmdb._schedules)
        ) = optional
        if readonly:
            stored = self.read(lambda txn: txn.get(b"format", db=self.meta), "reading the format marker")
        else:

            def mark(txn: lmdb.Transaction[bytes]) -> bytes | None:
                found = txn.get(b"format", db=self.meta)
                if found is None:
                    txn.put(b"format", FORMAT, db=self.meta)
                    return FORMAT
                return found

            stored = self.write(mark, "writing the format marker")
        if stored != FORMAT:
            raise CompatibilityError(
                f"{self.path} holds format {stored!r}, not {FORMAT.decode()}; use the Mayfly "
                "release that wrote it"
            )

    def _open_db(self, name: bytes, readonly: bool, present: bool) -> lmdb._Database | None:
        if readonly and not present and name in _OPTIONAL:
            return None
        return self.env.open_db(name, create=not readonly)

    # -- the gate: transactions in, resizes alone -------------------------------------------

    def _enter(self) -> int:
        """Admit a transaction; return the map generation it runs under."""
        with self._lock:
            while self._resizing:
                self._gate.wait()  # the condition is built on self._lock, held here
            self._active += 1
            return self._generation

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._resizing:
                self._gate.notify_all()

    def _resize(self, seen: int | None, operation: str) -> None:
        """Grow the map a write running under generation ``seen`` found full (``None``: adopt).

        ``None`` adopts the size another process set. A growth request from
        an older generation is dropped: another thread already grew the map.
        """
        with self._gate:
            while self._resizing:
                self._gate.wait()
            if seen is not None and seen != self._generation:
                return
            self._resizing = True
            try:
                while self._active:
                    self._gate.wait()
                current = self.env.info()["map_size"]
                if seen is None:
                    self.env.set_mapsize(0)
                elif self.env.reader_check():
                    # Readers of killed processes pinned old pages; freed now, retry before growing.
                    pass
                else:
                    if current >= self.max_map_size:
                        raise LmdbMapFull(self.path, operation, current, self.max_map_size)
                    self.env.set_mapsize(min(self.max_map_size, max(2 * current, current + _MIN_GROWTH)))
                self._generation += 1
            except lmdb.Error as error:
                raise map_error(error, self.path, operation) from None
            finally:
                self._resizing = False
                self._gate.notify_all()

    # -- transactions ------------------------------------------------------------------------

    def write(self, body: Callable[[lmdb.Transaction[bytes]], _T], operation: str) -> _T:
        """Run ``body`` in a write transaction and commit it; grow the map and retry when full.

        ``body`` must only call LMDB and plain Python (never park the
        greenlet, never call :meth:`write`), and may run more than once (a
        full map aborts the group and retries it), so it must not act outside
        the transaction unless it undoes that itself. If it raises, its
        writes are discarded and the exception is raised here. The result is
        returned only after the commit (durable in ``sync`` mode), which other
        writes may share (see the module docstring). From a hub task the
        write joins the hub's open batch and waits on an offload thread.
        """
        if self.readonly:
            raise JournalUnavailable(
                f"{operation} refused: lmdb environment {self.path} was opened with readonly=true"
            )
        write = _Write(body, operation)
        try:
            hub = current_hub()
        except HubNotRunning:
            self._write_many([write])
        else:
            self._write_on_hub(hub, write)
        result: _T = write.outcome()
        return result

    # -- hub tasks: one offload per batch of writes --------------------------------------------

    def _write_on_hub(self, hub: Hub, write: _Write) -> None:
        """Add the write to this hub's open batch (opening one if none is) and park until it is done.

        The task that opens a batch lets every other ready task of the hub run
        once, so their writes join it, then carries the whole batch to the
        group commit in one offload: the hub pays one thread hand-off per
        batch, not per write. If that task is cancelled, a member of the batch
        takes it over, so no write is left without a task waiting for it.
        """
        batch = self._hub_open.get(id(hub))
        if batch is not None and batch.hub is hub:
            batch.writes.append(write)
            self._wait_member(hub, batch, write)
            return
        batch = _HubBatch(hub)
        batch.writes.append(write)
        self._hub_open[id(hub)] = batch
        try:
            checkpoint()  # every other ready task of the hub runs once: their writes join the batch
        except BaseException:
            self._close(hub, batch)
            batch.writes.remove(write)  # never submitted: this write is not made
            if batch.writes:
                batch.orphaned = True
                batch.event.set()
            raise
        self._close(hub, batch)
        self._own(batch)

    def _close(self, hub: Hub, batch: _HubBatch) -> None:
        if self._hub_open.get(id(hub)) is batch:
            del self._hub_open[id(hub)]

    def _wait_member(self, hub: Hub, batch: _HubBatch, write: _Write) -> None:
        """Park until the owner reports the write done; take over a batch left by a cancelled owner."""
        while True:
            try:
                batch.event.wait()
            except BaseException:
                if not batch.submitted and write in batch.writes:
                    batch.writes.remove(write)  # never submitted: this write is not made
                raise
            if write.done:
                return
            if batch.orphaned:
                batch.orphaned = False
                batch.event = Event()  # the other members wait on the new owner's event
                self._close(hub, batch)
                self._own(batch)

    def _own(self, batch: _HubBatch) -> None:
        """Carry the batch to the group commit (once) and wait for it; wake every member on the hub."""
        try:
            if not batch.submitted:
                batch.submitted = True
                offload(self._write_batch, batch)
            else:
                offload(batch.finished.wait)
        except BaseException:
            # Cancelled (the offload runs on): a member still waiting owns the batch from here.
            if any(not write.done for write in batch.writes):
                batch.orphaned = True
            batch.event.set()
            raise
        batch.event.set()

    def _write_batch(self, batch: _HubBatch) -> None:
        try:
            self._write_many(batch.writes)
        finally:
            batch.finished.set()

    # -- the group commit --------------------------------------------------------------------

    def _write_many(self, writes: list[_Write]) -> None:
        """Queue the writes and wait until the group commits covering them are done, leading when no one is.

        Only the threads concerned are woken: each waiter once all its writes
        are done, and the oldest waiting write's thread when leadership passes
        to it.
        """
        waiter = _Waiter(len(writes))
        for write in writes:
            write.waiter = waiter
        with self._queue:
            self._pending.extend(writes)
            lead = not self._leading
            self._leading = True
        while True:
            if lead:
                self._lead(waiter)
                return
            waiter.event.wait()
            waiter.event.clear()
            if waiter.remaining == 0:
                return
            if waiter.promoted:
                waiter.promoted = False
                lead = True  # the previous leader's writes were done before these

    def _take(self) -> list[_Write]:
        with self._queue:
            group = self._pending[:_GROUP_LIMIT]
            del self._pending[:_GROUP_LIMIT]
        return group

    def _lead(self, own: _Waiter) -> None:
        """Commit queued groups until ``own``'s writes are done, waking each waiter; then hand over."""
        try:
            while own.remaining:
                group: list[_Write] = []
                try:
                    self._commit_group(group)
                except BaseException as error:
                    # Nothing of the group was committed (the commit is the last step): each write fails.
                    self._fail(group, error)
                finally:
                    for write in group:
                        write.done = True
                        waiter = write.waiter
                        assert waiter is not None
                        waiter.remaining -= 1
                        if not waiter.remaining and waiter is not own:
                            waiter.event.set()
        finally:
            with self._queue:
                if self._pending:
                    successor = self._pending[0].waiter
                    assert successor is not None
                    successor.promoted = True
                    successor.event.set()  # the oldest waiting write's thread leads next
                else:
                    self._leading = False

    def _commit_group(self, group: list[_Write]) -> list[_Write]:
        """Take LMDB's writer lock, then the queued writes (into ``group``), and commit them as one."""
        while True:
            seen = self._enter()
            try:
                txn = self.env.begin(write=True)
                try:
                    # Taken only now: writes queued while this thread waited for the lock join the group.
                    group.extend(self._take())
                    if len(group) == 1:
                        self._run_alone(txn, group[0])
                    else:
                        for write in group:
                            self._run_nested(txn, write)
                    txn.commit()
                except BaseException:
                    txn.abort()
                    raise
                self.commits += 1
                self.writes += len(group)
                group_flushed(len(group))  # the crash-test hook: committed, nobody woken yet
                return group
            except lmdb.MapFullError:
                grow: int | None = seen
            except lmdb.MapResizedError:
                grow = None
            except lmdb.ReadersFullError as error:
                try:
                    self._clear_stale_readers(error, group[0].operation if group else "a write")
                except MayflyError as failure:
                    return self._fail(group, failure)
                continue
            except lmdb.Error as error:
                for write in group:
                    write.error = map_error(error, self.path, write.operation)
                return group
            except _Failed as failed:
                (write,) = group  # the only write of its group raised: the error is its own
                write.error = failed.error
                return group
            finally:
                self._leave()
            try:
                self._resize(grow, group[0].operation if group else "a write")
            except LmdbMapFull as full:
                for write in group:
                    write.error = LmdbMapFull(self.path, write.operation, full.observed, full.limit)
                return group
            except MayflyError as failure:
                return self._fail(group, failure)

    @staticmethod
    def _fail(group: list[_Write], error: BaseException) -> list[_Write]:
        for write in group:
            write.error = error
            write.shared = True
        return group

    def _run_alone(self, txn: lmdb.Transaction[bytes], write: _Write) -> None:
        """A group of one runs in the transaction itself: if it raises, the transaction is aborted."""
        try:
            write.result = write.body(txn)
            write.error = None
        except (lmdb.MapFullError, lmdb.MapResizedError):
            raise
        except lmdb.Error as error:
            raise _Failed(map_error(error, self.path, write.operation)) from None
        except BaseException as error:
            raise _Failed(error) from None

    def _run_nested(self, txn: lmdb.Transaction[bytes], write: _Write) -> None:
        """Run one write of a group in a nested transaction, so that if it raises it writes nothing."""
        child = self.env.begin(write=True, parent=txn)
        try:
            write.result = write.body(child)
            write.error = None
        except (lmdb.MapFullError, lmdb.MapResizedError):
            child.abort()
            raise
        except lmdb.Error as error:
            child.abort()
            write.error = map_error(error, self.path, write.operation)
            return
        except BaseException as error:
            child.abort()
            write.error = error
            return
        child.commit()

    def read(self, body: Callable[[lmdb.Transaction[bytes]], _T], operation: str) -> _T:
        """Run ``body`` in one read-only transaction (a consistent snapshot) and end it.

        A writer killed inside its commit, after writing the new meta page but
        before publishing the transaction id to readers, leaves readers one
        transaction behind until the next writer repairs the lock table. Such
        a lagging snapshot would disagree with the next append, so it is
        detected and the repair forced before reading.
        """
        repaired = self.readonly
        while True:
            self._enter()
            try:
                txn = self.env.begin()
                try:
                    if not repaired and txn.id() < self.env.info()["last_txnid"]:
                        repaired = True
                        txn.abort()
                        # Taking the writer lock runs LMDB's dead-owner recovery, which
                        # publishes the newest committed transaction to readers.
                        self.env.begin(write=True).abort()
                        continue
                    return body(txn)
                finally:
                    txn.abort()
            except lmdb.MapResizedError:
                pass
            except lmdb.ReadersFullError as error:
                self._clear_stale_readers(error, operation)
                continue
            except lmdb.Error as error:
                raise map_error(error, self.path, operation) from None
            finally:
                self._leave()
            self._resize(None, operation)

    def _clear_stale_readers(self, error: lmdb.ReadersFullError, operation: str) -> None:
        """Free reader slots of dead processes, or raise the mapped error if none were stale."""
        try:
            cleared = self.env.reader_check()
        except lmdb.Error as failure:
            raise map_error(failure, self.path, operation) from None
        if not cleared:
            raise map_error(error, self.path, operation) from None

    def copy(self, destination: str, *, compact: bool, operation: str) -> None:
        """Copy the environment into the empty directory ``destination`` (a consistent snapshot)."""
        while True:
            self._enter()
            try:
                self.env.copy(destination, compact=compact)
                return
            except lmdb.MapResizedError:
                pass
            except lmdb.Error as error:
                raise map_error(error, self.path, operation) from None
            finally:
                self._leave()
            self._resize(None, operation)

    def flush(self, operation: str) -> None:
        """Force committed pages to stable storage (used for fencing tokens in ``nosync`` mode)."""
        try:
            self.env.sync(True)
        except lmdb.Error as error:
            raise map_error(error, self.path, operation) from None

    @property
    def map_size(self) -> int:
        """The current map size of this process's mapping, in bytes."""
        return self.env.info()["map_size"]


class _Failed(Exception):
    """The only write of a group raised: abort the transaction and report the write's own error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


_REGISTRY: dict[str, SharedEnv] = {}
_REGISTRY_LOCK = threading.Lock()


def acquire_env(target: LmdbTarget) -> SharedEnv:
    """Return the process's shared environment for ``target``, opening it on first use."""
    key = os.path.realpath(target.path)
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(key)
        if shared is not None and shared.pid != os.getpid():
            # Inherited through fork: LMDB handles are not usable in a child; open afresh.
            del _REGISTRY[key]
            shared = None
        if shared is None:
            shared = SharedEnv(target)
            _REGISTRY[key] = shared
        else:
            if shared.readonly and not target.readonly:
                raise InvalidBackendURL(
                    f"lmdb environment {key} is already open read-only in this process; close that "
                    "journal before opening it for writing"
                )
            if not target.readonly and shared.sync != target.sync:
                raise InvalidBackendURL(
                    f"lmdb environment {key} is already open in this process with durability="
                    f"{'sync' if shared.sync else 'nosync'}; open it with the same durability"
                )
            shared.max_map_size = max(shared.max_map_size, target.max_map_size)
        shared.references += 1
        return shared


def release_env(shared: SharedEnv) -> None:
    """Drop one reference; the last one closes the LMDB environment."""
    with _REGISTRY_LOCK:
        shared.references -= 1
        if shared.references > 0:
            return
        key = os.path.realpath(shared.path)
        if _REGISTRY.get(key) is shared:
            del _REGISTRY[key]
    if shared.pid == os.getpid():
        shared.env.close()
