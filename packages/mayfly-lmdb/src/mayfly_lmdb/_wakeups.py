"""Wake-ups for idle workers of an ``lmdb://`` environment: one FIFO per listening worker in ``DIR/wakeups/``.

A worker with nothing to do sleeps until its poll interval ends, the next
wake time comes, or someone makes a run claimable now. For the last, a
listening worker creates a FIFO and waits on its hub for it to become
readable; whoever makes a run claimable (a submit, a signal, a wake, an
append or index write leaving a run claimable with no live lease, a
released run) writes one byte into every FIFO. Nothing here is durable or
needed for correctness — a worker that misses a byte finds the run at its
next poll — it only turns a poll interval of latency into a millisecond.
Every call is non-blocking, so it runs inline on the hub.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import Final, final

__all__ = ["WakeupListener", "notify_wakeups"]

_SUFFIX: Final = ".fifo"


def notify_wakeups(directory: str) -> None:
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
        except OSError:
            pass  # full of unread wake-ups already (the worker will look anyway), or gone meanwhile
        finally:
            os.close(fd)


@final
class WakeupListener:
    """One worker's FIFO: readable when someone made a run claimable; :meth:`drain` it, :meth:`close` it."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}")
        os.mkfifo(self._path, 0o600)
        self._read = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # Holding a write end of our own keeps the FIFO from reading as end-of-file (always readable)
        # between two notifiers.
        self._keep = os.open(self._path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    @property
    def path(self) -> str:
        """The FIFO's path."""
        return self._path

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
