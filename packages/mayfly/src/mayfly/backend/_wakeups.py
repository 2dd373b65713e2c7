"""FIFO wake-ups for idle workers of a store on this host: one FIFO per listening worker in a directory.

For a backend whose workers share a host (the ``file://``, ``lmdb://`` and
SQLite stores): its ``listen_wakeups`` returns
``FifoWakeupListener(DIR)``, its ``notify_wakeups`` calls
``notify_fifo_wakeups(DIR)``, with ``DIR`` a directory beside the store.

A worker that has nothing to do sleeps until its poll interval ends, the
next wake time comes, or someone makes a run claimable now. For the last, a
listening worker creates a FIFO and waits for it to become readable on its
hub; whoever makes a run claimable (a submit, a signal, a wake, a released
run) writes one byte into every FIFO. Nothing here is durable or needed for
correctness — a worker that misses a byte finds the run at its next poll —
it only turns a poll interval of latency into a millisecond.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import final

__all__ = ["FifoWakeupListener", "notify_fifo_wakeups"]

_SUFFIX = ".fifo"


def notify_fifo_wakeups(directory: str | os.PathLike[str]) -> None:
    """Write one byte into every listening worker's FIFO; drop the FIFOs of workers that are gone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(_SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            if error.errno == errno.ENXIO:  # no reader: the worker that made it is gone
                with contextlib.suppress(OSError):
                    os.unlink(path)
            continue
        try:
            os.write(fd, b"\0")
        except BlockingIOError:
            pass  # the FIFO is full of unread wake-ups already: the worker will look anyway
        except OSError:
            pass
        finally:
            os.close(fd)


@final
class FifoWakeupListener:
    """One worker's FIFO: readable when someone made a run claimable; :meth:`drain` it, :meth:`close` it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}")
        os.mkfifo(self._path, 0o600)
        self._read = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # Holding a write end of our own keeps the FIFO from reading as end-of-file (always readable)
        # between two notifiers.
        self._keep = os.open(self._path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """The descriptor to wait on for readability."""
        return self._read

    def drain(self) -> None:
        """Consume every pending wake-up byte."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        """Stop listening and remove the FIFO."""
        for fd in (self._read, self._keep):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(self._path)
