"""``RunHandle``: a submitted run, watched through the journal from any process."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, final

from mayfly.commit import keeps_run_index
from mayfly.model.errors import HubNotRunning, WaitTimeout
from mayfly.runindex import IndexStatus
from mayfly.substrate import current_hub, sleep

if TYPE_CHECKING:
    from mayfly.runtime.runtime import RunResult, WorkflowRuntime

__all__ = ["RunHandle"]

_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5


@final
class RunHandle:
    """A run created with :meth:`WorkflowRuntime.start`; whoever drives it (a worker), read it here."""

    __slots__ = ("_runtime", "run_id")

    def __init__(self, runtime: WorkflowRuntime, run_id: str) -> None:
        self._runtime = runtime
        self.run_id = run_id
        """The run's id."""

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def status(self) -> str:
        """``running``, ``waiting`` (parked on a signal), or the terminal status (``succeeded``...)."""
        return self._read()[1]

    def _read(self) -> tuple[RunResult, str]:
        result = self._runtime.summary(self.run_id)
        if result.status.is_terminal:
            return result, result.status.value
        if result.waiting:
            return result, "waiting"
        # Parked on a child run's wait: its worker recorded it waiting, with only a wake to end that.
        journal = self._runtime.journal
        if keeps_run_index(journal):
            entry = journal.index_get(self.run_id)
            if entry is not None and entry.status is IndexStatus.WAITING and entry.ready_at_ms is None:
                return result, "waiting"
        return result, "running"

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait until the run ends or parks on a signal, and return its result.

        Raises :class:`~mayfly.errors.WaitTimeout` (a ``TimeoutError``) if that
        takes longer than ``timeout`` seconds. Polls the journal, so it works
        from any process; inside a hub task it parks the task instead of the
        thread.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_POLL_S
        while True:
            result, status = self._read()
            if status != "running":
                return result
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"run {self.run_id} neither ended nor parked within {timeout} s; it is still running"
                )
            wait = pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))
            _sleep(wait)
            pause = min(pause * 2, _MAX_POLL_S)


def _sleep(seconds: float) -> None:
    try:
        current_hub()
    except HubNotRunning:
        time.sleep(seconds)
        return
    sleep(seconds)
