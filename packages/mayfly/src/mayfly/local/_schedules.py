"""Stored schedules of a ``file://`` store (feature ``schedule_store``): one file per schedule.

Layout::

    DIR/schedules/<name>.schedule   the definition: mayfly.schedules.encode_schedule bytes
    DIR/schedules/<name>.tick       the last tick recorded started, decimal ASCII (advisory)
    DIR/schedules.lock              flock target: puts, removes and marks, serialised across processes

Every write replaces a whole file atomically (a temporary file, fsynced in
``fsync`` mode, renamed over the old one, then the directory fsynced), so a
reader without the lock sees the old file or the new one, never a mix, and a
crash leaves one of them. A put reads the stored version under the lock, so a
conditional put is atomic across processes. Damaged bytes fail closed on read
(the definition's checksum, a tick that is not a number).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mayfly.journal import Durability
from mayfly.local._store import Layout, off_hub, sync_directory
from mayfly.model.errors import CorruptionError, JournalUnavailable
from mayfly.schedules import (
    Schedule,
    StoredSchedule,
    check_put,
    check_schedule_name,
    check_tick,
    decode_schedule,
    encode_schedule,
    next_stored,
)

__all__ = ["LocalSchedules"]

_DIRECTORY = "schedules"
_LOCK = "schedules.lock"
_DEFINITION = ".schedule"
_TICK = ".tick"
_MAX_TICK_TEXT = 32


class LocalSchedules:
    """The ``schedule_store`` methods of :class:`~mayfly.local._journal.LocalWorkflowJournal` (a mixin).

    The journal provides ``_layout`` (the store directory), ``_durability``
    (files are fsynced in ``fsync`` mode) and ``ensure_open``.
    """

    _layout: Layout
    _durability: Durability
    ensure_open: Callable[[str], None]

    def _schedules_root(self) -> Path:
        return self._layout.root

    def _schedules_durable(self) -> bool:
        return self._durability is Durability.DURABLE

    # -- paths and files ----------------------------------------------------------------------

    def _schedule_dir(self) -> Path:
        return self._schedules_root() / _DIRECTORY

    def _read_schedule(self, name: str) -> StoredSchedule | None:
        path = self._schedule_dir() / f"{name}{_DEFINITION}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise JournalUnavailable(f"cannot read schedule file {path}: {error}") from None
        return decode_schedule(data, where=f"schedule file {path}", last_tick_ms=self._read_tick(name))

    def _read_tick(self, name: str) -> int | None:
        path = self._schedule_dir() / f"{name}{_TICK}"
        try:
            text = path.read_bytes()[:_MAX_TICK_TEXT]
        except FileNotFoundError:
            return None
        except OSError as error:
            raise JournalUnavailable(f"cannot read schedule tick file {path}: {error}") from None
        try:
            return check_tick(int(text.decode("ascii")))
        except (ValueError, UnicodeDecodeError):
            raise CorruptionError(
                f"schedule tick file {path} is unreadable ({text!r}); delete it (it is advisory: the "
                "schedule then catches up as if it had no recorded tick)"
            ) from None

    def _replace_file(self, path: Path, data: bytes) -> None:
        directory = path.parent
        temporary = directory / f".{path.name}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._schedules_durable():
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        if self._schedules_durable():
            sync_directory(directory)

    def _remove_file(self, path: Path) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    @contextmanager
    def _schedules_locked(self) -> Iterator[None]:
        """The store's schedule lock (an exclusive ``flock``), with the schedule directory made."""
        root = self._schedules_root()
        directory = root / _DIRECTORY
        try:
            if not directory.is_dir():
                directory.mkdir(exist_ok=True)
                if self._schedules_durable():
                    sync_directory(root)
            fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise JournalUnavailable(f"cannot open the schedule lock in {root}: {error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    # -- the locked operations (off the hub: they wait for the lock and the disk) --------------

    def _put_locked(self, schedule: Schedule, now_ms: int, expected_version: int | None) -> StoredSchedule:
        with self._schedules_locked():
            stored = next_stored(
                self._read_schedule(schedule.name), schedule, now_ms=now_ms, expected_version=expected_version
            )
            self._replace_file(
                self._schedule_dir() / f"{schedule.name}{_DEFINITION}", encode_schedule(stored)
            )
            return stored

    def _remove_locked(self, name: str) -> bool:
        with self._schedules_locked():
            directory = self._schedule_dir()
            removed = self._remove_file(directory / f"{name}{_DEFINITION}")
            self._remove_file(directory / f"{name}{_TICK}")
            if removed and self._schedules_durable():
                sync_directory(directory)
            return removed

    def _mark_locked(self, name: str, tick_ms: int) -> bool:
        with self._schedules_locked():
            directory = self._schedule_dir()
            if not (directory / f"{name}{_DEFINITION}").exists():
                return False
            last = self._read_tick(name)
            if last is None or tick_ms > last:
                self._replace_file(directory / f"{name}{_TICK}", f"{tick_ms}\n".encode("ascii"))
            return True

    # -- the ScheduleStore methods -------------------------------------------------------------

    def schedule_put(
        self, schedule: Schedule, *, now_ms: int, expected_version: int | None = None
    ) -> StoredSchedule:
        """Store the schedule under its name (create or replace; versioned), durably in ``fsync`` mode."""
        check_put(schedule, now_ms, expected_version)
        self.ensure_open("schedules")
        stored: StoredSchedule = off_hub(self._put_locked, schedule, now_ms, expected_version)
        return stored

    def schedule_get(self, name: str) -> StoredSchedule | None:
        """The stored schedule, or ``None``."""
        check_schedule_name(name)
        self.ensure_open("schedules")
        return self._read_schedule(name)

    def schedule_list(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        self.ensure_open("schedules")
        try:
            files = os.listdir(self._schedule_dir())
        except FileNotFoundError:
            return []
        except OSError as error:
            raise JournalUnavailable(f"cannot list {self._schedule_dir()}: {error}") from None
        names = sorted(f.removesuffix(_DEFINITION) for f in files if f.endswith(_DEFINITION))
        found = [self._read_schedule(name) for name in names]
        return [stored for stored in found if stored is not None]

    def schedule_remove(self, name: str) -> bool:
        """Remove the schedule and its last tick; ``False`` if there was none."""
        check_schedule_name(name)
        self.ensure_open("schedules")
        removed: bool = off_hub(self._remove_locked, name)
        return removed

    def schedule_mark(self, name: str, tick_ms: int) -> bool:
        """Record a started tick (the later one wins); ``False`` if no schedule has the name."""
        check_schedule_name(name)
        check_tick(tick_ms)
        self.ensure_open("schedules")
        marked: bool = off_hub(self._mark_locked, name, tick_ms)
        return marked
