"""Child workflows: the closed catalog, call-graph checks and the pure parts of a child call.

A ``ChildCall`` node runs a workflow from the root specification's catalog as
its own run. The parent records ``ChildStarted`` (one parent attempt) before
the child exists, and ``ChildCompleted`` plus the mapped outcome when the
child's terminal result is reported. Mapping copies only declared top-level
fields, in and out, and the call's mode decides what a non-success child
means for the parent:

========================  ===================================  ====================================
child result              ``require_success``                  ``propagate``
========================  ===================================  ====================================
succeeded                 Succeeded(declared output fields)    Succeeded(declared output fields)
failed                    PermanentFailure                     PermanentFailure
blocked                   PermanentFailure                     Blocked
cancelled                 PermanentFailure                     Cancelled
========================  ===================================  ====================================

Nothing here creates ids or runs anything: the runtime supplies the child
run id and drives the child with :func:`child_create_run` and
:func:`child_completion`.
"""

from __future__ import annotations

from collections.abc import Iterator

from mayfly.model.commands import CompleteChild, CreateRun
from mayfly.model.errors import ValidationIssue
from mayfly.model.events import ChildStarted, ParentLink, RunResult
from mayfly.model.json import JsonValue
from mayfly.model.limits import MAX_CHILD_DEPTH
from mayfly.model.outcomes import Blocked, Cancelled, NodeOutcome, PermanentFailure, Succeeded
from mayfly.model.spec import ChildCall, ChildDefinition, Node, WorkflowSpec
from mayfly.model.state import NodeStatus, RunState, RunStatus

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_RUN_BLOCKED = RunStatus.BLOCKED
_RUN_CANCELLED = RunStatus.CANCELLED
_RUN_FAILED = RunStatus.FAILED
_RUN_SUCCEEDED = RunStatus.SUCCEEDED
_SUCCEEDED = NodeStatus.SUCCEEDED


__all__ = [
    "call_graph_issues",
    "catalog_entry",
    "child_completion",
    "child_create_run",
    "child_input",
    "child_outcome",
    "child_output",
    "child_spec",
    "nesting_depth",
    "project_fields",
]

_Key = tuple[str, int]


def _label(key: _Key) -> str:
    return f"{key[0]}@{key[1]}"


def catalog_entry(spec: WorkflowSpec, workflow_id: str, version: int) -> ChildDefinition | None:
    """The catalog definition of ``workflow_id@version`` in ``spec``, or ``None``."""
    for entry in spec.catalog:
        if entry.workflow_id == workflow_id and entry.version == version:
            return entry
    return None


def child_spec(parent: WorkflowSpec, definition: ChildDefinition) -> WorkflowSpec:
    """The pinned specification of a child run of ``definition``.

    It carries the root's whole catalog (so grandchildren resolve against
    the same closed set) and the root's jitter seed; its budgets are the
    definition's own.
    """
    return WorkflowSpec(
        workflow_id=definition.workflow_id,
        version=definition.version,
        nodes=definition.nodes,
        edges=definition.edges,
        initial=definition.initial,
        budgets=definition.budgets,
        catalog=parent.catalog,
        jitter_seed=parent.jitter_seed,
        schema_version=parent.schema_version,
    )


def project_fields(value: JsonValue, fields: tuple[str, ...]) -> dict[str, JsonValue]:
    """The declared top-level ``fields`` of ``value`` that it has (nothing else, never invented)."""
    if not isinstance(value, dict):
        return {}
    return {name: value[name] for name in fields if name in value}


def child_input(run_input: JsonValue, node: Node) -> dict[str, JsonValue]:
    """The child run's input: the call's declared fields of the run input overlaid by the node input."""
    assert node.child is not None
    source: dict[str, JsonValue] = {}
    if isinstance(run_input, dict):
        source.update(run_input)
    if isinstance(node.input, dict):
        source.update(node.input)
    return project_fields(source, node.child.inputs)


def child_outcome(call: ChildCall, child_run_id: str, result: RunResult, output: JsonValue) -> NodeOutcome:
    """The parent node's outcome for a child's terminal ``result``, through the call's mode."""
    if result == "succeeded":
        return Succeeded(output=project_fields(output, call.outputs))
    what = f"child run {child_run_id} ({call.workflow_id}@{call.version}) {result}"
    if call.mode == "require_success":
        return PermanentFailure(reason=f"{what}; the call requires success")
    if result == "blocked":
        return Blocked(reason=what)
    if result == "cancelled":
        return Cancelled(reason=what)
    return PermanentFailure(reason=what)


def child_create_run(state: RunState, started: ChildStarted) -> CreateRun:
    """The ``CreateRun`` for the child run that ``started`` (a committed ChildStarted of ``state``) names.

    The spec comes from the catalog, the input is the mapped input recorded
    in the event, and the parent link carries the parent run, node, attempt
    and the child's nesting depth.
    """
    definition = catalog_entry(state.spec, started.workflow_id, started.version)
    if definition is None:
        raise ValueError(
            f"run {state.run_id} has no catalog entry {started.workflow_id}@{started.version}; "
            "the ChildStarted does not belong to this run"
        )
    return CreateRun(
        run_id=started.child_run_id,
        spec=child_spec(state.spec, definition),
        input=started.input,
        parent=ParentLink(
            run_id=state.run_id,
            node_id=started.node_id,
            attempt_id=started.attempt_id,
            depth=state.depth + 1,
        ),
    )


def child_output(state: RunState, fields: tuple[str, ...]) -> dict[str, JsonValue]:
    """A run's output: each of ``fields`` from the last node, in spec order, whose Succeeded output has it."""
    output: dict[str, JsonValue] = {}
    for node in state.nodes:
        outcome = node.last_outcome
        if node.status is _SUCCEEDED and isinstance(outcome, Succeeded):
            output.update(project_fields(outcome.output, fields))
    return output


_RESULTS: dict[RunStatus, RunResult] = {
    _RUN_SUCCEEDED: "succeeded",
    _RUN_FAILED: "failed",
    _RUN_BLOCKED: "blocked",
    _RUN_CANCELLED: "cancelled",
}


def child_completion(child: RunState, outputs: tuple[str, ...]) -> CompleteChild:
    """The parent's ``CompleteChild`` for a terminal child run, with its declared ``outputs``."""
    if child.parent is None:
        raise ValueError(f"run {child.run_id} is not a child run")
    result = _RESULTS.get(child.status)
    if result is None:
        raise ValueError(f"child run {child.run_id} is still running; report it once it is terminal")
    return CompleteChild(
        node_id=child.parent.node_id,
        attempt_id=child.parent.attempt_id,
        child_run_id=child.run_id,
        result=result,
        output=child_output(child, outputs) if result == "succeeded" else None,
    )


# -- call graph -----------------------------------------------------------------


def _calls(nodes: tuple[Node, ...]) -> Iterator[_Key]:
    for node in nodes:
        if node.child is not None:
            yield (node.child.workflow_id, node.child.version)


def _graph(spec: WorkflowSpec) -> tuple[_Key, dict[_Key, list[_Key]]]:
    root: _Key = (spec.workflow_id, spec.version)
    # The root first, so that a cycle through it is reported starting from it.
    graph: dict[_Key, list[_Key]] = {root: list(_calls(spec.nodes))}
    for entry in spec.catalog:
        graph.setdefault((entry.workflow_id, entry.version), list(_calls(entry.nodes)))
    # References outside the closed catalog are reported elsewhere; they have no body to follow.
    for key, calls in graph.items():
        graph[key] = [k for k in calls if k in graph]
    return root, graph


def _find_cycles(graph: dict[_Key, list[_Key]]) -> list[list[_Key]]:
    """One cycle per back edge found by an iterative depth-first search, in a stable order."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    cycles: list[list[_Key]] = []
    for start, calls in graph.items():
        if color[start] != white:
            continue
        path = [start]
        stack = [iter(calls)]
        color[start] = grey
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = black
                stack.pop()
            elif color[nxt] == grey:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif color[nxt] == white:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(graph[nxt]))
    return cycles


def _longest_chain(root: _Key, graph: dict[_Key, list[_Key]]) -> list[_Key]:
    """The longest call chain from ``root`` (the graph must be acyclic)."""
    best: dict[_Key, list[_Key]] = {}
    order: list[_Key] = []
    seen: set[_Key] = set()
    stack: list[tuple[_Key, bool]] = [(root, False)]
    while stack:
        key, done = stack.pop()
        if done:
            order.append(key)
            continue
        if key in seen:
            continue
        seen.add(key)
        stack.append((key, True))
        stack.extend((callee, False) for callee in graph[key] if callee not in seen)
    for key in order:  # post-order: callees first
        chains = [best[callee] for callee in graph[key]]
        longest = max(chains, key=len, default=[])
        best[key] = [key, *longest]
    return best[root]


def call_graph_issues(spec: WorkflowSpec) -> list[ValidationIssue]:
    """Recursion (direct or indirect) anywhere in the catalog, and nesting deeper than eight levels."""
    root, graph = _graph(spec)
    cycles = _find_cycles(graph)
    if cycles:
        return [
            ValidationIssue(
                "catalog",
                "recursive child workflows are not allowed: " + " -> ".join(map(_label, cycle)),
            )
            for cycle in cycles
        ]
    chain = _longest_chain(root, graph)
    levels = len(chain) - 1
    if levels > MAX_CHILD_DEPTH:
        return [
            ValidationIssue(
                "catalog",
                f"child workflows nest {levels} levels ({' -> '.join(map(_label, chain))}), "
                f"over the limit of {MAX_CHILD_DEPTH}",
            )
        ]
    return []


def nesting_depth(spec: WorkflowSpec) -> int:
    """How many child levels ``spec`` may call below itself (0 without child calls); spec must be valid."""
    root, graph = _graph(spec)
    return len(_longest_chain(root, graph)) - 1
