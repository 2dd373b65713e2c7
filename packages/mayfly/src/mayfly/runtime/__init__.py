"""The handler runtime: registry, requests, and ``WorkflowRuntime`` over the greenlet hub."""

from mayfly.runtime._driver import RunDriver, cancel_run_cascade
from mayfly.runtime.handle import RunHandle
from mayfly.runtime.registry import Handler, HandlerEntry, HandlerFunction, HandlerRegistry
from mayfly.runtime.request import DependencyResult, HandlerRequest
from mayfly.runtime.runtime import (
    NodeSummary,
    RunResult,
    SignalDisposition,
    UnsupportedInCurrentTask,
    WorkflowRuntime,
)
from mayfly.runtime.signals import WaitForSignal, new_signal_token

__all__ = [
    "DependencyResult",
    "Handler",
    "HandlerEntry",
    "HandlerFunction",
    "HandlerRegistry",
    "HandlerRequest",
    "NodeSummary",
    "RunDriver",
    "RunHandle",
    "RunResult",
    "SignalDisposition",
    "UnsupportedInCurrentTask",
    "WaitForSignal",
    "WorkflowRuntime",
    "cancel_run_cascade",
    "new_signal_token",
]
