"""Handler invocation and failure mapping: one attempt's request, its call, and what a failure becomes.

A handler sees a :class:`~mayfly.runtime.request.HandlerRequest` built from
committed state only (:func:`handler_request`), runs offloaded unless it is
cooperative (:func:`invoke_handler`), and whatever goes wrong becomes a
bounded, typed outcome here, in one place for both ways a handler runs:

- a return value that is not an outcome, a raised
  :class:`~mayfly.model.errors.NonRetryable`, an exception of a type the
  registration names ``non_retryable``, a ``TypeError`` or a broken limit:
  ``PermanentFailure``;
- any other exception: ``RetryableFailure`` (the retry policy decides);
- cancellation is never the handler's failure, and ``KeyboardInterrupt`` or
  ``SystemExit`` stops the process, not the attempt: neither becomes an
  outcome, so an attempt stopped that way stays in flight for resume.

Reasons are cut at the 4 KiB bound, marked as cut: exception text is
diagnostic, not durable data (ARCHITECTURE section 7).
"""

from __future__ import annotations

from typing import Any

from mayfly.model.errors import LimitExceeded, NonRetryable, TaskCancelled, TaskFailed
from mayfly.model.ids import idempotency_key
from mayfly.model.limits import MAX_REASON_BYTES
from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.signals import AcceptedSignal
from mayfly.model.state import RunState
from mayfly.runtime.registry import HandlerEntry, HandlerRegistry
from mayfly.runtime.request import DependencyResult, HandlerRequest, clone_json
from mayfly.runtime.signals import WaitForSignal
from mayfly.substrate import CancellationHandle, Task, offload

__all__ = [
    "HandlerResult",
    "attempt_result",
    "bounded_reason",
    "failure_outcome",
    "handler_request",
    "invoke_handler",
    "invoke_inline",
]

HandlerResult = NodeOutcome | WaitForSignal
"""What a handler may return: an outcome, or a request to wait for a signal."""

_OUTCOME_TYPES = (
    Succeeded,
    ChangesRequested,
    RetryableFailure,
    PermanentFailure,
    Blocked,
    Cancelled,
    Skipped,
)
_PERMANENT_ERRORS = ("mayfly.model.errors.LimitExceeded", "TypeError")


def bounded_reason(text: str) -> str:
    """``text`` as a reason: valid UTF-8 within the 4 KiB bound, cut (and marked so) if longer."""
    raw = text.encode("utf-8", "replace")  # a lone surrogate in exception text becomes "?"
    if len(raw) <= MAX_REASON_BYTES:
        return raw.decode("utf-8")
    # Exception text is diagnostic, not durable data: cut at the bound, marking the cut.
    return raw[: MAX_REASON_BYTES - 16].decode("utf-8", "ignore") + " [...truncated]"


def _described(error: BaseException) -> str:
    """``KeyError: 'sku'``: the exception's type and text, even when its ``__str__`` fails."""
    try:
        text = str(error)
    except Exception:  # a handler's exception must not break the recording of its failure
        text = "<unprintable>"
    return f"{type(error).__qualname__}: {text}"


def handler_request(
    state: RunState,
    index: int,
    attempt_id: str,
    cancellation: CancellationHandle,
    registry: HandlerRegistry,
) -> tuple[HandlerEntry, HandlerRequest]:
    """The handler of node ``index`` and the request its attempt ``attempt_id`` sees, from ``state``."""
    node = state.node(index)
    assert node.spec.handler is not None
    entry = registry.resolve(node.spec.handler)
    assert entry is not None
    # Upstream outcomes: the depends_on prerequisites, then the sources of incoming
    # conditional edges (a correction loop's implement sees its reviewer's verdict).
    dependencies = {}
    upstream = node.spec.depends_on
    if node.in_edges:  # only then is there an edge to look for (most nodes have none)
        upstream = (
            *upstream,
            *(e.source for e in state.spec.edges if e.target == node.node_id and e.source not in upstream),
        )
    for source in upstream:
        other = state.node_by_id(source)
        if other is not None and other.last_outcome is not None:
            dependencies[source] = DependencyResult.of(source, other.last_outcome)
    request = HandlerRequest(
        run_id=state.run_id,
        node_id=node.node_id,
        handler=node.spec.handler,
        attempt=node.attempt,
        attempt_id=attempt_id,
        idempotency_key=idempotency_key(state.run_id, node.node_id, attempt_id),
        deadline=node.attempt_deadline,
        input=clone_json(node.spec.input),
        run_input=clone_json(state.input),
        dependencies=dependencies,
        cancellation=cancellation,
        node_attempts=node.total_attempts,
        signal=None
        if node.signal is None
        else AcceptedSignal(node.signal.signal_id, node.signal.name, clone_json(node.signal.decision)),
    )
    return entry, request


def invoke_handler(entry: HandlerEntry, request: HandlerRequest) -> HandlerResult:
    """Call the handler (offloaded unless cooperative) and return a valid outcome or wait.

    A return value that is not an outcome becomes a PermanentFailure naming
    what was returned, and so does a raised :class:`NonRetryable` or an
    exception of a type the registration names ``non_retryable``, naming the
    exception; other exceptions propagate to the caller's task.
    """
    permanent: tuple[type[Exception], ...] = (NonRetryable, *entry.non_retryable)
    try:
        result: Any = entry.fn(request) if entry.cooperative else offload(entry.fn, request)
    except TaskCancelled:
        raise  # cancellation is never the handler's failure, even under non_retryable=(Exception,)
    except permanent as exc:
        reason = f"handler raised {_described(exc)}"
        if isinstance(exc, NonRetryable) and exc.__cause__ is not None:
            reason += f" (from {_described(exc.__cause__)})"
        return PermanentFailure(reason=bounded_reason(reason))
    if isinstance(result, (*_OUTCOME_TYPES, WaitForSignal)):
        checked: HandlerResult = result
        return checked
    return PermanentFailure(
        reason=bounded_reason(
            f"handler {entry.ref} returned {type(result).__name__}, expected an outcome such as "
            "Succeeded(output=...)"
        )
    )


def invoke_inline(entry: HandlerEntry, request: HandlerRequest) -> HandlerResult:
    """:func:`invoke_handler` in the calling task, with a raised exception mapped as a task's failure is."""
    try:
        return invoke_handler(entry, request)
    except TaskCancelled:
        raise
    except Exception as exc:  # the handler's failure becomes a typed outcome
        failed = TaskFailed(entry.ref, type(exc).__qualname__, str(exc))
        failed.__cause__ = exc
        return failure_outcome(failed)


def attempt_result(task: Task[Any]) -> HandlerResult | None:
    """What the finished task of an attempt came to; ``None`` when there is nothing to commit.

    ``None`` for a cancelled task (the run closed the attempt, and its
    outcome is already committed) and for one stopped by ``KeyboardInterrupt``
    or ``SystemExit`` (the hub re-raises it, and the attempt stays in flight
    for resume to re-invoke).
    """
    try:
        result: HandlerResult = task.result()
    except TaskCancelled:
        return None
    except TaskFailed as failed:
        if not isinstance(failed.__cause__, Exception):
            return None
        return failure_outcome(failed)
    return result


def failure_outcome(error: TaskFailed) -> NodeOutcome:
    """The typed outcome of a handler that raised: retryable unless the error is a contract breach."""
    reason = bounded_reason(f"handler raised {error.error_type}: {error.error_message}")
    if error.error_type in _PERMANENT_ERRORS or isinstance(error.__cause__, LimitExceeded):
        return PermanentFailure(reason=reason)
    return RetryableFailure(reason=reason)
