"""``RunHandle``: a submitted run, watched through the journal from any process."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, final

from mayfly.model.errors import HubNotRunning, RunNotFound, WaitTimeout
from mayfly.model.state import RunState
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
        state = self._runtime.inspect(self.run_id).state
        result = self._runtime.summary_of(state)
        if result.status.is_terminal:
            return result, result.status.value
        if result.waiting or self._child_waits(state):
            return result, "waiting"
        return result, "running"

    def _child_waits(self, state: RunState) -> bool:
        """Whether a child run this run is calling now is parked on a signal (at any depth)."""
        for attempt_id, _ in state.active_attempts():
            record = state.attempt(attempt_id)
            if record is not None and record.child_run_id is not None:
                try:
                    if RunHandle(self._runtime, record.child_run_id).status() == "waiting":
                        return True
                except RunNotFound:
                    continue  # started but not created yet: it runs when its parent is driven
        return False

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
