"""Helpers of the mayfly-lmdb tests: record factories and worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from mayfly.journal import JournalRecord

WORKER = Path(__file__).with_name("_worker.py")


def new_id() -> str:
    """A fresh canonical UUID string."""
    return str(uuid.uuid4())


def batch(run_id: str, first: int, count: int = 1, *, size: int = 16) -> list[JournalRecord]:
    """Sealed records of ``run_id`` at ``first, first + 1, ...`` with ~``size``-byte payloads."""
    return [
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=new_id(),
            event_type="Probe",
            schema_version=1,
            payload=json.dumps({"sequence": sequence, "fill": "x" * size}).encode(),
        )
        for sequence in range(first, first + count)
    ]


class Worker:
    """A child process running one mode of ``_worker.py``, line-oriented over stdout."""

    def __init__(self, mode: str, **arguments: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), mode, json.dumps(arguments)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def readline(self) -> str:
        """The child's next stdout line; fail with its stderr if it ended instead."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=60)
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AssertionError(f"worker exited {self.process.returncode}: {stderr.strip()}")
        return line.strip()

    def finish(self, timeout: float = 120) -> list[str]:
        """Wait for a clean exit and return the remaining stdout lines."""
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, f"worker exited {self.process.returncode}: {err.strip()}"
        return out.splitlines()

    def kill(self) -> None:
        """SIGKILL the child (no cleanup runs in it) and reap it."""
        self.process.kill()
        self.process.communicate(timeout=60)

    def close(self) -> None:
        """Make sure the child is gone."""
        if self.process.poll() is None:
            self.kill()
