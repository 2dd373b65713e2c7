"""Mayfly: durable workflows as a plain Python library.

Build a :class:`WorkflowSpec` (by hand, from JSON, or with a :class:`Flow`),
register handlers on a :class:`HandlerRegistry`,
and run it with :class:`WorkflowRuntime` — durably, on the embedded local
journal by default or any installed backend. :func:`list_runs` lists a
journal's runs and :class:`RunInspection` shows one (:mod:`mayfly.inspect`).

The error hierarchy is :mod:`mayfly.errors` (every error is a
:class:`MayflyError`) and the identities and their grammars are
:mod:`mayfly.ids`. Backend authors import from :mod:`mayfly.journal`,
:mod:`mayfly.lease`, :mod:`mayfly.hookspecs`, :mod:`mayfly.substrate` and
:mod:`mayfly.testing`; plugin contexts are :mod:`mayfly.plugins`. The
reducer's command vocabulary stays under :mod:`mayfly.reducer` and
:mod:`mayfly.model`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from mayfly import errors, ids
from mayfly.errors import MayflyError, NonRetryable
from mayfly.flow import Flow
from mayfly.inspect import RunInspection, list_runs
from mayfly.model.outcomes import (
    ArtifactRef,
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    NodeOutcomeKind,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    ExponentialBackoff,
    FixedBackoff,
    ImmediateBackoff,
    Node,
    OnAnyOutcome,
    OnField,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.runtime import (
    Handler,
    HandlerRegistry,
    HandlerRequest,
    RunResult,
    WaitForSignal,
    WorkflowRuntime,
    new_signal_token,
)

__version__ = "0.1.0"

__all__ = [
    "ArtifactRef",
    "Blocked",
    "Cancelled",
    "ChangesRequested",
    "ChildCall",
    "ChildDefinition",
    "Edge",
    "ExponentialBackoff",
    "FixedBackoff",
    "Flow",
    "Handler",
    "HandlerRegistry",
    "HandlerRequest",
    "ImmediateBackoff",
    "MayflyError",
    "Node",
    "NodeOutcome",
    "NodeOutcomeKind",
    "NodeStatus",
    "NonRetryable",
    "OnAnyOutcome",
    "OnField",
    "OnOutcome",
    "PermanentFailure",
    "RetryPolicy",
    "RetryableFailure",
    "RunBudgets",
    "RunInspection",
    "RunResult",
    "RunStatus",
    "Skipped",
    "Succeeded",
    "WaitForSignal",
    "Worker",
    "WorkflowRuntime",
    "WorkflowSpec",
    "errors",
    "ids",
    "list_runs",
    "new_signal_token",
]

# Names the root exported before it became a user API, and where each lives now. They still
# resolve, with a DeprecationWarning naming the new home, so old code keeps running while it moves.
_MOVED: dict[str, str] = {
    **dict.fromkeys(errors.__all__, "mayfly.errors"),
    **dict.fromkeys(ids.__all__, "mayfly.ids"),
    **dict.fromkeys(
        (
            "AdvanceTime",
            "AttemptStart",
            "CancelRun",
            "Command",
            "CompleteAttempt",
            "CreateRun",
            "Rejection",
            "RejectionCode",
            "StartNodes",
        ),
        "mayfly.model.commands",
    ),
    **dict.fromkeys(("decide", "ensure_valid", "reduce", "replay", "validate"), "mayfly.reducer"),
    **dict.fromkeys(("inspect_run", "replay_run", "resume_run"), "mayfly.recovery"),
    **dict.fromkeys(("list_backends", "open_journal", "open_leases", "plugin_manager"), "mayfly.plugins"),
    "RunState": "mayfly.model.state",
    "WorkflowJournal": "mayfly.journal",
    "RecoveryLeaseStore": "mayfly.lease",
    "build_inspection": "mayfly.inspect",
}


if TYPE_CHECKING:  # type checkers see the lazily loaded names' real types
    from mayfly.worker import Worker

# Public names whose modules sit above the runtime (a worker imports it): loaded on first use.
_LAZY: dict[str, str] = {"Worker": "mayfly.worker"}


def __getattr__(name: str) -> object:
    lazy = _LAZY.get(name)
    if lazy is not None:
        return getattr(importlib.import_module(lazy), name)
    home = _MOVED.get(name)
    if home is None or name in __all__:
        raise AttributeError(f"module 'mayfly' has no attribute {name!r}")
    warnings.warn(
        f"mayfly.{name} moved to {home}.{name}; import it from there", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(home), name)
