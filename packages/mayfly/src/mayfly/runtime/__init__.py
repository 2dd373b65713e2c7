"""The handler runtime: registry, requests, and ``WorkflowRuntime`` over the greenlet hub."""

from mayfly.runtime._driver import RunDriver
from mayfly.runtime.registry import HandlerEntry, HandlerFunction, HandlerRegistry
from mayfly.runtime.request import DependencyResult, HandlerRequest
from mayfly.runtime.runtime import (
    NodeSummary,
    RunResult,
    UnsupportedInCurrentTask,
    WorkflowRuntime,
    set_backend_resolver,
)

__all__ = [
    "DependencyResult",
    "HandlerEntry",
    "HandlerFunction",
    "HandlerRegistry",
    "HandlerRequest",
    "NodeSummary",
    "RunDriver",
    "RunResult",
    "UnsupportedInCurrentTask",
    "WorkflowRuntime",
    "set_backend_resolver",
]
