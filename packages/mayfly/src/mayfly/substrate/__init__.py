"""The greenlet hub: Mayfly's only scheduler, timer system, fd reactor and blocking-call boundary.

Everything that runs, waits or sleeps inside Mayfly does so as a task of one
:class:`Hub` (ADR-0033: one execution owner). Blocking calls cross
:func:`offload`, the only place Mayfly creates OS threads. Every wait that
takes a ``timeout`` raises :class:`~mayfly.model.errors.WaitTimeout` (a
``TimeoutError``) when it runs out; :func:`offload` raises its subclass
:class:`~mayfly.model.errors.OffloadTimeout`. :class:`GroupCommit` lets many
tasks' appends share one flush (a backend's group commit).
"""

from mayfly.model.errors import (
    Deadlock,
    HubAlreadyRunning,
    HubNotRunning,
    OffloadTimeout,
    SubstrateError,
    TaskCancelled,
    TaskFailed,
    TaskNotDone,
    WaitTimeout,
)
from mayfly.substrate._clock import Clock, RealClock, VirtualClock
from mayfly.substrate._group import GroupCommit, group_flushed
from mayfly.substrate._hub import (
    FAILURE_MESSAGE_LIMIT,
    CancellationHandle,
    HasFileno,
    Hub,
    HubStats,
    Task,
    checkpoint,
    current_hub,
    current_task,
    now_ms,
    offload,
    sleep,
    sleep_until,
    spawn,
    wait_fd,
    wait_readable,
    wait_writable,
)
from mayfly.substrate._sync import Channel, Event

__all__ = [
    "FAILURE_MESSAGE_LIMIT",
    "CancellationHandle",
    "Channel",
    "Clock",
    "Deadlock",
    "Event",
    "GroupCommit",
    "HasFileno",
    "Hub",
    "HubAlreadyRunning",
    "HubNotRunning",
    "HubStats",
    "OffloadTimeout",
    "RealClock",
    "SubstrateError",
    "Task",
    "TaskCancelled",
    "TaskFailed",
    "TaskNotDone",
    "VirtualClock",
    "WaitTimeout",
    "checkpoint",
    "current_hub",
    "current_task",
    "group_flushed",
    "now_ms",
    "offload",
    "sleep",
    "sleep_until",
    "spawn",
    "wait_fd",
    "wait_readable",
    "wait_writable",
]
