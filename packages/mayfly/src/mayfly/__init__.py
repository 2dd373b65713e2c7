"""Mayfly: durable workflows as a plain Python library.

Build a :class:`WorkflowSpec`, register handlers on a :class:`HandlerRegistry`,
and run it with :class:`WorkflowRuntime` — durably, on the embedded local
journal by default or any installed backend. Backend authors import from
:mod:`mayfly.journal`, :mod:`mayfly.lease`, :mod:`mayfly.hookspecs` and
:mod:`mayfly.testing`.
"""

from __future__ import annotations

from mayfly.inspect import RunInspection, build_inspection
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    CreateRun,
    Rejection,
    RejectionCode,
    StartNodes,
)
from mayfly.model.errors import *  # noqa: F403  # the error hierarchy is public API
from mayfly.model.errors import __all__ as _errors_all
from mayfly.model.ids import *  # noqa: F403  # identities are public API
from mayfly.model.ids import __all__ as _ids_all
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
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import list_backends, open_journal, open_leases, plugin_manager
from mayfly.recovery import inspect_run, replay_run, resume_run
from mayfly.reducer import decide, ensure_valid, reduce, replay, validate
from mayfly.runtime import (
    HandlerRegistry,
    HandlerRequest,
    RunResult,
    WorkflowRuntime,
    set_backend_resolver,
)
from mayfly.telemetry import set_metrics_publisher


def _open_backends(url: str) -> tuple[WorkflowJournal, RecoveryLeaseStore]:
    return open_journal(url), open_leases(url)


# The lower layers cannot import the plugin manager; the package root wires it in.
set_backend_resolver(_open_backends)
set_metrics_publisher(plugin_manager)

__version__ = "0.1.0.dev0"

__all__ = [  # noqa: PLE0604  # extended with the error and identity names below
    "AdvanceTime",
    "ArtifactRef",
    "AttemptStart",
    "Blocked",
    "CancelRun",
    "Cancelled",
    "ChangesRequested",
    "ChildCall",
    "ChildDefinition",
    "Command",
    "CompleteAttempt",
    "CreateRun",
    "Edge",
    "ExponentialBackoff",
    "FixedBackoff",
    "HandlerRegistry",
    "HandlerRequest",
    "ImmediateBackoff",
    "Node",
    "NodeOutcome",
    "NodeOutcomeKind",
    "NodeStatus",
    "OnAnyOutcome",
    "OnField",
    "OnOutcome",
    "PermanentFailure",
    "Rejection",
    "RejectionCode",
    "RetryPolicy",
    "RetryableFailure",
    "RunBudgets",
    "RunInspection",
    "RunResult",
    "RunState",
    "RunStatus",
    "Skipped",
    "StartNodes",
    "Succeeded",
    "WorkflowRuntime",
    "WorkflowSpec",
    "build_inspection",
    "decide",
    "ensure_valid",
    "inspect_run",
    "list_backends",
    "open_journal",
    "open_leases",
    "reduce",
    "replay",
    "replay_run",
    "resume_run",
    "validate",
    *_errors_all,
    *_ids_all,
]
