"""Specification validation: every problem at once, each located by its path.

Paths name nodes by id where the id is usable (``nodes[review].depends_on[2]``)
and by position otherwise (``nodes[3].id``), so an author can find the
problem in the JSON or the Python that produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from mayfly.model.errors import (
    InvalidIdentifier,
    LimitExceeded,
    SpecValidationError,
    ValidationIssue,
)
from mayfly.model.ids import NODE_ID_GRAMMAR, is_node_id, parse_workflow_id
from mayfly.model.limits import MAX_EVIDENCE_REFS, MAX_INLINE_INPUT_BYTES, MAX_NODES
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.spec import (
    SUPPORTED_SPEC_SCHEMA_VERSIONS,
    ExponentialBackoff,
    FixedBackoff,
    Node,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
    parse_handler_ref,
)

__all__ = ["check_input", "ensure_valid", "validate"]

_Add = Callable[[ValidationIssue], None]

_RETRYABLE_CLASSES = frozenset({NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE})
_JSON = msgspec.json.Encoder()
_MAX_OUTPUT_NAME = 64


def check_input(value: object, what: str = "input") -> None:
    """Raise if ``value`` is not JSON-encodable or its compact JSON is over 64 KiB."""
    try:
        size = len(_JSON.encode(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"{what} is not JSON-serializable: {exc}") from None
    if size > MAX_INLINE_INPUT_BYTES:
        raise LimitExceeded(f"inline {what} (use artifact references)", MAX_INLINE_INPUT_BYTES, size)


def ensure_valid(spec: WorkflowSpec) -> WorkflowSpec:
    """Return ``spec`` if valid, else raise :class:`SpecValidationError` listing every issue."""
    issues = validate(spec)
    if issues:
        raise SpecValidationError(issues)
    return spec


def validate(spec: WorkflowSpec) -> list[ValidationIssue]:
    """Every problem in ``spec``, in a stable order; an empty list means valid."""
    # Python-built structs skip msgspec's type checks; a JSON round trip applies them
    # with located messages ("Expected `int`, got `str` - at `$.nodes[0].retry`").
    try:
        msgspec.json.decode(_JSON.encode(spec), type=WorkflowSpec)
    except (msgspec.ValidationError, msgspec.EncodeError, TypeError) as exc:
        return [ValidationIssue("", f"malformed specification: {exc}")]
    issues: list[ValidationIssue] = []
    add = issues.append
    if spec.schema_version not in SUPPORTED_SPEC_SCHEMA_VERSIONS:
        supported = ", ".join(map(str, sorted(SUPPORTED_SPEC_SCHEMA_VERSIONS)))
        add(
            ValidationIssue(
                "schema_version",
                f"unknown specification schema version {spec.schema_version} (this Mayfly reads {supported})",
            )
        )
        return issues
    try:
        parse_workflow_id(spec.workflow_id)
    except InvalidIdentifier as exc:
        add(ValidationIssue("workflow_id", str(exc)))
    if spec.version < 1:
        add(ValidationIssue("version", f"must be >= 1, got {spec.version}"))
    _check_budgets(spec.budgets, "budgets", add)
    if not spec.nodes:
        add(ValidationIssue("nodes", "a workflow needs at least one node"))
        return issues
    if len(spec.nodes) > MAX_NODES:
        add(ValidationIssue("nodes", f"{len(spec.nodes)} nodes, over the limit of {MAX_NODES}"))
        return issues
    if spec.edges:
        add(ValidationIssue("edges", "conditional edges are not supported by this Mayfly version"))
    if spec.catalog:
        add(ValidationIssue("catalog", "child workflows are not supported by this Mayfly version"))

    ids: dict[str, int] = {}
    for position, node in enumerate(spec.nodes):
        label = node.id if is_node_id(node.id) else str(position)
        path = f"nodes[{label}]"
        if not is_node_id(node.id):
            add(ValidationIssue(f"{path}.id", f"invalid node id {node.id!r}: expected {NODE_ID_GRAMMAR}"))
        elif node.id in ids:
            add(
                ValidationIssue(
                    f"{path}.id", f"duplicate node id {node.id!r} (also at position {ids[node.id]})"
                )
            )
        else:
            ids[node.id] = position
        _check_node(node, path, add)

    for node in spec.nodes:
        path = f"nodes[{node.id}]" if is_node_id(node.id) else "nodes[?]"
        seen: set[str] = set()
        for j, prereq in enumerate(node.depends_on):
            where = f"{path}.depends_on[{j}]"
            if prereq not in ids:
                add(ValidationIssue(where, f"unknown node {prereq!r}"))
            elif prereq == node.id:
                add(ValidationIssue(where, "a node cannot depend on itself"))
            elif prereq in seen:
                add(ValidationIssue(where, f"duplicate dependency {prereq!r}"))
            seen.add(prereq)

    if spec.initial is not None:
        if not spec.initial:
            add(ValidationIssue("initial", "when given, initial must name at least one node"))
        seen_initial: set[str] = set()
        for j, node_id in enumerate(spec.initial):
            if node_id not in ids:
                add(ValidationIssue(f"initial[{j}]", f"unknown node {node_id!r}"))
            elif node_id in seen_initial:
                add(ValidationIssue(f"initial[{j}]", f"duplicate initial node {node_id!r}"))
            seen_initial.add(node_id)

    # Cycle and reachability analysis needs well-formed ids and references.
    if len(ids) == len(spec.nodes) and all(
        prereq in ids and prereq != node.id for node in spec.nodes for prereq in node.depends_on
    ):
        issues.extend(_graph_issues(spec, ids))
    return issues


def _check_budgets(budgets: RunBudgets, path: str, add: _Add) -> None:
    if budgets.max_attempts < 1:
        add(ValidationIssue(f"{path}.max_attempts", f"must be >= 1, got {budgets.max_attempts}"))
    if budgets.max_transitions < 1:
        add(ValidationIssue(f"{path}.max_transitions", f"must be >= 1, got {budgets.max_transitions}"))
    if budgets.max_elapsed_ms is not None and budgets.max_elapsed_ms < 1:
        add(ValidationIssue(f"{path}.max_elapsed_ms", f"must be >= 1, got {budgets.max_elapsed_ms}"))


def _check_node(node: Node, path: str, add: _Add) -> None:
    if node.child is not None:
        add(ValidationIssue(f"{path}.child", "child workflows are not supported by this Mayfly version"))
    if node.handler is None:
        add(ValidationIssue(f"{path}.handler", "a node needs a handler ('name@version')"))
    else:
        try:
            parse_handler_ref(node.handler)
        except InvalidIdentifier as exc:
            add(ValidationIssue(f"{path}.handler", str(exc)))
    try:
        check_input(node.input)
    except ValueError as exc:
        add(ValidationIssue(f"{path}.input", str(exc)))
    if len(node.artifacts) > MAX_EVIDENCE_REFS:
        add(
            ValidationIssue(
                f"{path}.artifacts",
                f"{len(node.artifacts)} references, over the limit of {MAX_EVIDENCE_REFS}",
            )
        )
    names: set[str] = set()
    for j, name in enumerate(node.outputs):
        if not name or len(name) > _MAX_OUTPUT_NAME or not name.isascii() or not name.isprintable():
            add(ValidationIssue(f"{path}.outputs[{j}]", f"invalid output name {name!r}"))
        elif name in names:
            add(ValidationIssue(f"{path}.outputs[{j}]", f"duplicate output name {name!r}"))
        names.add(name)
    if node.max_attempts is not None and node.max_attempts < 1:
        add(ValidationIssue(f"{path}.max_attempts", f"must be >= 1, got {node.max_attempts}"))
    _check_retry(node.retry, f"{path}.retry", add)


def _check_retry(retry: RetryPolicy, path: str, add: _Add) -> None:
    if retry.max_attempts < 1:
        add(ValidationIssue(f"{path}.max_attempts", f"must be >= 1, got {retry.max_attempts}"))
    for j, kind in enumerate(retry.retry_on):
        if kind is NodeOutcomeKind.CHANGES_REQUESTED:
            add(
                ValidationIssue(
                    f"{path}.retry_on[{j}]",
                    "changes_requested is never retried; route it with a correction edge",
                )
            )
        elif kind not in _RETRYABLE_CLASSES:
            add(
                ValidationIssue(
                    f"{path}.retry_on[{j}]",
                    f"{kind.value} cannot be retried (only retryable_failure, permanent_failure)",
                )
            )
    if len(set(retry.retry_on)) != len(retry.retry_on):
        add(ValidationIssue(f"{path}.retry_on", "duplicate outcome classes"))
    backoff = retry.backoff
    if isinstance(backoff, FixedBackoff) and backoff.delay_ms < 0:
        add(ValidationIssue(f"{path}.backoff.delay_ms", f"must be >= 0, got {backoff.delay_ms}"))
    if isinstance(backoff, ExponentialBackoff):
        if backoff.initial_ms < 0:
            add(ValidationIssue(f"{path}.backoff.initial_ms", f"must be >= 0, got {backoff.initial_ms}"))
        if backoff.multiplier < 1:
            add(ValidationIssue(f"{path}.backoff.multiplier", f"must be >= 1, got {backoff.multiplier}"))
        if backoff.maximum_ms < backoff.initial_ms:
            add(
                ValidationIssue(
                    f"{path}.backoff.maximum_ms",
                    f"must be >= initial_ms ({backoff.initial_ms}), got {backoff.maximum_ms}",
                )
            )
    if retry.jitter_max_ms < 0:
        add(ValidationIssue(f"{path}.jitter_max_ms", f"must be >= 0, got {retry.jitter_max_ms}"))
    if retry.attempt_deadline_ms is not None and retry.attempt_deadline_ms < 1:
        add(ValidationIssue(f"{path}.attempt_deadline_ms", f"must be >= 1, got {retry.attempt_deadline_ms}"))


def _graph_issues(spec: WorkflowSpec, ids: dict[str, int]) -> Iterable[ValidationIssue]:
    """Cycles among unconditional dependencies, and nodes that could never become ready."""
    nodes = spec.nodes
    indegree = [len(node.depends_on) for node in nodes]
    dependents: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for prereq in node.depends_on:
            dependents[ids[prereq]].append(i)
    queue = [i for i, degree in enumerate(indegree) if degree == 0]
    ordered = 0
    while queue:
        i = queue.pop()
        ordered += 1
        for d in dependents[i]:
            indegree[d] -= 1
            if indegree[d] == 0:
                queue.append(d)
    if ordered < len(nodes):
        stuck = [nodes[i].id for i, degree in enumerate(indegree) if degree > 0]
        shown = ", ".join(stuck[:10]) + (", ..." if len(stuck) > 10 else "")
        yield ValidationIssue(
            "nodes", f"dependency cycle among unconditional depends_on edges through: {shown}"
        )
        return
    initial = set(spec.initial) if spec.initial is not None else None
    for node in nodes:
        if not node.depends_on and initial is not None and node.id not in initial:
            yield ValidationIssue(
                f"nodes[{node.id}]",
                "can never become ready: not in initial, no depends_on and no incoming edge",
            )
