"""The local store's directory layout, URL parsing, fencing counters and fsync helpers.

Layout of a ``file://DIR`` store::

    DIR/mayfly-local.json        format marker {"format": "mayfly-local", "version": 2}
    DIR/runs/<run_id>.mwj        append-only MWJ2 (and older MWJ1) frames, one file per run
    DIR/snapshots/<run_id>.mws   one MWS1 frame, replaced atomically
    DIR/snapshots/<run_id>.idx   the MWX2 offset hint of the run file (derived)
    DIR/fences/<run_id>          the run's newest fencing token, decimal ASCII
    DIR/leases/<run_id>.lock     flock target of the run's recovery lease

The run file's ``flock`` is the run's mutex across processes: appends hold it
exclusively while they compare, write and sync, and a lease grant holds it
while it bumps the fencing counter, so an append and a grant are ordered.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypeVar

import msgspec

from mayfly.backend import VOLATILE_FILESYSTEMS, filesystem_type, parse_backend_url
from mayfly.journal import Durability
from mayfly.model.errors import (
    CompatibilityError,
    CorruptionError,
    DurabilityUnavailable,
    HubNotRunning,
    JournalUnavailable,
)
from mayfly.substrate import current_hub, offload

__all__ = [
    "MAX_FENCE_TEXT",
    "VOLATILE_FILESYSTEMS",
    "Layout",
    "LocalTarget",
    "check_durability",
    "filesystem_type",
    "locked",
    "open_run_file",
    "parse_fence",
    "parse_url",
    "read_fence",
    "read_whole",
    "sync_data",
    "sync_directory",
    "write_fence",
]

T = TypeVar("T")

FORMAT_MARKER: Final = "mayfly-local.json"
FORMAT_NAME: Final = "mayfly-local"
FORMAT_VERSION: Final = 2
# Version 1 stores hold only MWJ1 frames; this code reads them and marks them
# version 2 on open, since it appends MWJ2 frames that a version-1 reader
# would take for damage.
_UPGRADABLE_VERSIONS: Final = frozenset({1})
_DURABILITY_NAMES: Final = {
    "fsync": Durability.DURABLE,
    "durable": Durability.DURABLE,
    "flush": Durability.FLUSH,
    "write": Durability.WRITE,
}
MAX_FENCE_TEXT: Final = 32
"""Longest fencing counter text read (the counter is 21 bytes: a right-aligned token and a newline)."""
_SHAPE: Final = "file:///DIR?durability=fsync|flush|write, or a bare directory path"
_fdatasync = getattr(os, "fdatasync", os.fsync)


@dataclass(frozen=True, slots=True)
class LocalTarget:
    """A parsed ``file://`` URL: the store directory and the durability asked for."""

    root: Path
    durability: Durability
    url: str


class LocalOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of a ``file://`` URL."""

    durability: Literal["fsync", "durable", "flush", "write"] = "fsync"
    """When an append is acknowledged: ``fsync`` (``durable``), ``flush`` or ``write``."""


def parse_url(url: str) -> LocalTarget:
    """Parse ``file://DIR?durability=fsync|flush|write`` or a bare path (default ``fsync``)."""
    parsed = parse_backend_url(url, LocalOptions, _SHAPE, kind="path", label="local journal", bare_path=True)
    name = parsed.options.durability
    root = Path(parsed.location).expanduser().absolute()
    canonical = f"file://{root}?durability={name}" if parsed.given else f"file://{root}"
    return LocalTarget(root=root, durability=_DURABILITY_NAMES[name], url=canonical)


def check_durability(target: LocalTarget) -> None:
    """Refuse ``fsync`` durability on a volatile filesystem, where fsync cannot keep the promise."""
    if target.durability is not Durability.DURABLE:
        return
    fstype = filesystem_type(target.root)
    if fstype in VOLATILE_FILESYSTEMS:
        raise DurabilityUnavailable(
            f"local journal {target.root} is on {fstype}, which loses everything when the host "
            "stops, so fsync durability cannot be met; use a disk-backed directory, or "
            "?durability=write to accept that"
        )


def sync_directory(path: Path) -> None:
    """fsync a directory so a file created or renamed in it survives a host crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def off_hub(fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)``, a call that waits for the disk: offloaded from a hub task, else inline.

    A flush never blocks the hub (ADR-0033): the calling task parks while an
    offload thread waits for the disk, and the hub runs every other task
    meanwhile, so concurrent runs' flushes overlap (the filesystem merges
    them into shared journal commits). The locks such a call takes are then
    held by the offload thread, never by a parked task, so another task
    wanting one waits at most for that one flush.
    """
    try:
        current_hub()
    except HubNotRunning:
        return fn(*args)
    return offload(fn, *args)


def sync_data(fd: int) -> None:
    """Flush a file's data (and the size change) to stable storage."""
    _fdatasync(fd)


class Layout:
    """The directories of one store, created on first open."""

    __slots__ = ("_fences_text", "_runs_text", "_snapshots_text", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        # Hot paths build file names as plain strings; Path arithmetic costs more than a write.
        self._runs_text = os.fspath(root / "runs")
        self._fences_text = os.fspath(root / "fences")
        self._snapshots_text = os.fspath(root / "snapshots")

    @property
    def runs(self) -> Path:
        """Where per-run journal files (MWJ2 frames) live."""
        return self.root / "runs"

    @property
    def snapshots(self) -> Path:
        """Where per-run MWS1 snapshot files live."""
        return self.root / "snapshots"

    @property
    def fences(self) -> Path:
        """Where per-run fencing counters live."""
        return self.root / "fences"

    @property
    def leases(self) -> Path:
        """Where per-run lease lock files live."""
        return self.root / "leases"

    def run_path(self, run_id: str) -> str:
        """The journal file of a run, as a string."""
        return f"{self._runs_text}/{run_id}.mwj"

    def fence_path(self, run_id: str) -> str:
        """The fencing counter of a run, as a string."""
        return f"{self._fences_text}/{run_id}"

    def snapshot_path(self, run_id: str) -> str:
        """The snapshot file of a run, as a string."""
        return f"{self._snapshots_text}/{run_id}.mws"

    def hint_path(self, run_id: str) -> str:
        """The frame-offset hint of a run, as a string."""
        return f"{self._snapshots_text}/{run_id}.idx"

    def run_file(self, run_id: str) -> Path:
        """The journal file of a run."""
        return self.runs / f"{run_id}.mwj"

    def snapshot_file(self, run_id: str) -> Path:
        """The snapshot file of a run."""
        return self.snapshots / f"{run_id}.mws"

    def hint_file(self, run_id: str) -> Path:
        """The MWX2 frame-offset hint of a run's journal file (derived, rebuilt when wrong)."""
        return self.snapshots / f"{run_id}.idx"

    def fence_file(self, run_id: str) -> Path:
        """The fencing counter of a run."""
        return self.fences / run_id

    def lease_file(self, run_id: str) -> Path:
        """The lease lock file of a run."""
        return self.leases / f"{run_id}.lock"

    def prepare(self) -> None:
        """Create the store's directories and format marker, or check an existing marker."""
        try:
            for directory in (self.root, self.runs, self.snapshots, self.fences, self.leases):
                if not directory.is_dir():
                    directory.mkdir(parents=True, exist_ok=True)
                    sync_directory(directory.parent)
            marker = self.root / FORMAT_MARKER
            if not marker.exists():
                self._write_marker(marker)
            content = json.loads(marker.read_text())
            if (
                isinstance(content, dict)
                and content.get("format") == FORMAT_NAME
                and content.get("version") in _UPGRADABLE_VERSIONS
                and len(content) == 2
            ):
                self._write_marker(marker)
                content = json.loads(marker.read_text())
        except OSError as error:
            raise JournalUnavailable(f"cannot open local journal directory {self.root}: {error}") from None
        except ValueError:
            raise CorruptionError(f"{marker} is not valid JSON; restore it") from None
        if content != {"format": FORMAT_NAME, "version": FORMAT_VERSION}:
            raise CompatibilityError(
                f"{self.root} holds {content!r}, not {FORMAT_NAME} version {FORMAT_VERSION}; "
                "use a Mayfly release that reads it"
            )

    def _write_marker(self, marker: Path) -> None:
        temporary = self.root / f".{FORMAT_MARKER}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}) + "\n")
        os.replace(temporary, marker)
        sync_directory(self.root)


def open_run_file(layout: Layout, run_id: str, *, create: bool, durable: bool = True) -> int | None:
    """Open a run's journal file for appending; ``None`` if absent and ``create`` is false.

    A newly created file has its directory fsynced before this returns (when
    ``durable``: a store in ``fsync`` mode), so the file itself cannot vanish
    after an acknowledged append.
    """
    path = layout.run_path(run_id)
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        if not create:
            return None
    fd = os.open(path, flags | os.O_CREAT, 0o644)
    if durable:
        sync_directory(layout.runs)
    return fd


def read_whole(path: str) -> bytes | None:
    """A file's bytes, or ``None`` if it does not exist (the hot path's plain-string read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(fd: int, operation: int) -> Iterator[None]:
    """Hold ``flock(fd, operation)`` for the block; the lock ends with the block."""
    fcntl.flock(fd, operation)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def read_fence(layout: Layout, run_id: str) -> int:
    """Return the run's newest fencing token, 0 if it was never leased."""
    try:
        fd = os.open(layout.fence_path(run_id), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        text = os.read(fd, MAX_FENCE_TEXT)
    finally:
        os.close(fd)
    return parse_fence(run_id, text)


def parse_fence(run_id: str, text: bytes) -> int:
    """The fencing token a counter file holds; unreadable text fails closed."""
    try:
        return int(text.decode("ascii"))
    except ValueError:
        raise CorruptionError(
            f"fencing counter of run {run_id} is unreadable ({text!r}); restore it"
        ) from None


def write_fence(layout: Layout, run_id: str, token: int, *, durable: bool = True) -> None:
    """Persist the run's fencing token, durably unless ``durable`` is false.

    A store in ``fsync`` mode keeps its tokens durable: one that went backwards
    after a host crash could be granted twice while the runs' history survived.
    In ``flush`` and ``write`` mode nothing the journal acknowledges survives a
    host crash either, and every process that held a token died with the host,
    so the counter is written without a sync (issue 18: a lease grant there
    cost two disk flushes for a promise the journal does not make). The first
    grant creates the counter atomically (tmp, fsync, rename, directory fsync).
    Later grants overwrite it in place with one ``pwrite`` of a fixed-width
    record and one ``fdatasync``: the record
    (21 bytes at offset 0) lies in one disk sector, which a disk writes whole
    (the assumption PostgreSQL's ``pg_control`` rests on too), so a crash
    leaves the old token or the new one, and a grant costs one sync, not two.
    """
    text = f"{token:>20}\n".encode("ascii")
    path = layout.fence_path(run_id)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        pass
    else:
        try:
            if os.pwrite(fd, text, 0) != len(text):
                raise OSError(f"short write of the fencing counter of run {run_id}")
            if durable:
                _fdatasync(fd)
        finally:
            os.close(fd)
        return
    # Plain strings, not pathlib: pathlib interns every name it parses, and these are all distinct.
    temporary = f"{os.path.dirname(path)}/.{run_id}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if durable:
        sync_directory(layout.fences)
