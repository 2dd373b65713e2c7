"""A small typed builder for workflow specifications written in Python.

A :class:`Flow` collects nodes and edges and builds the same serializable
:class:`~mayfly.model.spec.WorkflowSpec` the JSON format holds (handlers as
``"name@version"``), so a built spec runs with ``mayfly run`` after
``spec.to_json()``::

    flow = Flow("orders.fulfil", version=1)
    charge = flow.node(charge_card, retry=RetryPolicy(max_attempts=5))
    ship = flow.node(ship_order, after=[charge])
    spec = flow.build()

A node may also run another workflow as its work (:meth:`Flow.call`): a
child :class:`Flow` (or a :class:`~mayfly.model.spec.ChildDefinition`) goes
into the built spec's catalog, as a JSON ``"child"`` node and ``"catalog"``
entry would.

Dependencies are :class:`NodeRef` handles returned by :meth:`Flow.node`, so a
misspelled one is a name the type checker does not know. A node id written
as a string is checked when the spec is built, with a "did you mean" hint,
and so is every upstream output a typed handler reads (its keyword-only
parameters) but the node does not depend on.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, final

from mayfly.model.errors import SpecValidationError, ValidationIssue
from mayfly.model.ids import parse_node_id
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import ArtifactRef
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    DependencyPolicy,
    Edge,
    EdgePredicate,
    Node,
    OnAnyOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
    parse_handler_ref,
)
from mayfly.reducer import ensure_valid
from mayfly.runtime.registry import Handler

__all__ = ["Flow", "NodeRef"]


@final
class NodeRef:
    """A node of one :class:`Flow`: what ``after=`` and :meth:`Flow.edge` take instead of an id string."""

    __slots__ = ("_flow", "id")

    def __init__(self, flow: Flow, node_id: str) -> None:
        self._flow = flow
        self.id = node_id

    def __repr__(self) -> str:
        return f"<NodeRef {self.id} of {self._flow.workflow_id}@{self._flow.version}>"


_Ref = NodeRef | str


@final
class Flow:
    """Builds a :class:`WorkflowSpec` node by node; :meth:`build` checks every reference and validates."""

    def __init__(
        self,
        workflow_id: str,
        version: int,
        *,
        budgets: RunBudgets | None = None,
        jitter_seed: str = "",
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
    ) -> None:
        """``inputs`` and ``outputs`` are this flow's interface when another flow calls it (:meth:`call`).

        They are the top-level input fields a call may copy in and the output
        fields it may copy out (each declared in the ``outputs`` of one of its nodes).
        """
        self.workflow_id = workflow_id
        self.version = version
        self._budgets = RunBudgets() if budgets is None else budgets
        self._jitter_seed = jitter_seed
        self._interface = (tuple(inputs), tuple(outputs))
        self._catalog: dict[tuple[str, int], ChildDefinition] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._after: dict[str, tuple[_Ref, ...]] = {}
        self._handlers: dict[str, Handler[..., Any]] = {}
        self._edges: list[tuple[_Ref, _Ref, EdgePredicate, str | None]] = []

    def node(
        self,
        handler: Handler[..., Any] | str,
        *,
        id: str | None = None,
        after: Iterable[_Ref] = (),
        input: JsonValue = None,
        retry: RetryPolicy | None = None,
        policy: DependencyPolicy = "all_succeeded",
        outputs: Iterable[str] = (),
        artifacts: Iterable[ArtifactRef] = (),
        max_attempts: int | None = None,
    ) -> NodeRef:
        """Add a node running ``handler`` (a registered :class:`Handler` or ``"name@version"``).

        The node id defaults to the handler's name (dots become ``-``);
        ``after`` lists the nodes it depends on, under ``policy``.
        """
        if isinstance(handler, Handler):
            ref, name = handler.ref, handler.name
        elif isinstance(handler, str):
            ref, name = handler, parse_handler_ref(handler).name
        else:
            raise TypeError(
                f"Flow.node takes a registered handler or 'name@version', got {type(handler).__name__}; "
                "decorate the function with @registry.handler(version=1)"
            )
        node_id = self._new_id(parse_node_id(name.replace(".", "-") if id is None else id))
        upstream = tuple(after)
        for dependency in upstream:
            self._own(dependency, f"node {node_id!r} after=")
        fields: dict[str, Any] = {"handler": ref, "input": input, "policy": policy}
        fields |= {"outputs": tuple(outputs), "artifacts": tuple(artifacts), "max_attempts": max_attempts}
        if retry is not None:
            fields["retry"] = retry
        if isinstance(handler, Handler):
            self._handlers[node_id] = handler
        return self._add(node_id, fields, upstream)

    def call(
        self,
        child: Flow | ChildDefinition,
        *,
        id: str | None = None,
        after: Iterable[_Ref] = (),
        mode: Literal["propagate", "require_success"] = "require_success",
        inputs: Iterable[str] | None = None,
        outputs: Iterable[str] | None = None,
        input: JsonValue = None,
        retry: RetryPolicy | None = None,
        policy: DependencyPolicy = "all_succeeded",
        max_attempts: int | None = None,
    ) -> NodeRef:
        """Add a node whose work is a run of the workflow ``child``; it joins the built spec's catalog.

        ``child`` is a :class:`Flow` (built, with its own interface and any
        workflows it calls) or a :class:`~mayfly.model.spec.ChildDefinition`.
        ``inputs`` and ``outputs`` are the fields the call copies in (from the
        node's input: the run input overlaid with ``input``) and out (into the
        node's output); by default all of the child's interface. ``mode`` says
        what a non-success child means here: ``require_success`` fails the node,
        ``propagate`` gives it the child's outcome class. The node id defaults
        to the child's workflow id, dots written ``-``.
        """
        if isinstance(child, Flow):
            definition, nested = child._definition(), child._catalog
        elif isinstance(child, ChildDefinition):
            definition, nested = child, {}
        else:
            raise TypeError(
                f"Flow.call takes a Flow or a ChildDefinition, got {type(child).__name__}; "
                "for a handler use Flow.node"
            )
        node_id = self._new_id(parse_node_id(definition.workflow_id.replace(".", "-") if id is None else id))
        upstream = tuple(after)
        for dependency in upstream:
            self._own(dependency, f"node {node_id!r} after=")
        for entry in (*nested.values(), definition):
            self._catalogue(entry)
        call = ChildCall(
            definition.workflow_id,
            definition.version,
            mode,
            inputs=definition.inputs if inputs is None else tuple(inputs),
            outputs=definition.outputs if outputs is None else tuple(outputs),
        )
        # The node's output holds the fields the call copies out: it declares them, as a handler node would.
        fields: dict[str, Any] = {"child": call, "input": input, "policy": policy, "outputs": call.outputs}
        fields["max_attempts"] = max_attempts
        if retry is not None:
            fields["retry"] = retry
        return self._add(node_id, fields, upstream)

    def _new_id(self, node_id: str) -> str:
        if node_id in self._nodes:
            raise ValueError(
                f"flow {self.workflow_id}@{self.version} already has a node {node_id!r}; give this one id="
            )
        return node_id

    def _add(self, node_id: str, fields: dict[str, Any], upstream: tuple[_Ref, ...]) -> NodeRef:
        self._nodes[node_id] = fields
        self._after[node_id] = upstream
        return NodeRef(self, node_id)

    def _catalogue(self, definition: ChildDefinition) -> None:
        key = (definition.workflow_id, definition.version)
        if key == (self.workflow_id, self.version):
            raise ValueError(f"flow {self.workflow_id}@{self.version} cannot call itself")
        if self._catalog.setdefault(key, definition) != definition:
            raise ValueError(
                f"flow {self.workflow_id}@{self.version} already calls a different "
                f"{key[0]}@{key[1]}; a catalog holds one definition per workflow id and version"
            )

    def _definition(self) -> ChildDefinition:
        """This flow as a catalog entry: its built nodes, edges and budgets, and its interface."""
        spec = self.build()
        return ChildDefinition(
            workflow_id=spec.workflow_id,
            version=spec.version,
            nodes=spec.nodes,
            edges=spec.edges,
            budgets=spec.budgets,
            inputs=self._interface[0],
            outputs=self._interface[1],
        )

    def edge(
        self,
        source: _Ref,
        target: _Ref,
        *,
        when: EdgePredicate | None = None,
        exclusive: str | None = None,
    ) -> None:
        """Add a conditional transition: ``target`` activates when ``source``'s outcome matches ``when``."""
        self._own(source, "edge source")
        self._own(target, "edge target")
        self._edges.append((source, target, OnAnyOutcome() if when is None else when, exclusive))

    def build(self, *, initial: Iterable[_Ref] | None = None) -> WorkflowSpec:
        """The specification, after checking every id and every upstream output a typed handler reads.

        ``initial`` names the nodes that start the run, as a graph with a
        correction loop must; by default every node nothing leads to does.

        Raises :class:`~mayfly.errors.SpecValidationError` listing every
        problem, an unknown id with the nearest known one.
        """
        issues: list[ValidationIssue] = []
        nodes = []
        for node_id, fields in self._nodes.items():
            depends_on = tuple(
                self._resolve(ref, f"nodes[{node_id}].depends_on[{i}]", issues)
                for i, ref in enumerate(self._after[node_id])
            )
            nodes.append(Node(node_id, depends_on=depends_on, **fields))
        edges = []
        for i, (source, target, when, exclusive) in enumerate(self._edges):
            edges.append(
                Edge(
                    self._resolve(source, f"edges[{i}].source", issues),
                    self._resolve(target, f"edges[{i}].target", issues),
                    when=when,
                    exclusive=exclusive,
                )
            )
        starts = None
        if initial is not None:
            starts = []
            for i, ref in enumerate(initial):
                self._own(ref, "initial")
                starts.append(self._resolve(ref, f"initial[{i}]", issues))
        for node in nodes:
            issues += self._reads(node, edges)
        if issues:
            raise SpecValidationError(issues)
        spec = WorkflowSpec(
            workflow_id=self.workflow_id,
            version=self.version,
            nodes=tuple(nodes),
            edges=tuple(edges),
            initial=None if starts is None else tuple(starts),
            budgets=self._budgets,
            catalog=tuple(self._catalog.values()),
            jitter_seed=self._jitter_seed,
        )
        return ensure_valid(spec)

    # -- references ------------------------------------------------------------------

    def _own(self, ref: _Ref, where: str) -> None:
        if isinstance(ref, NodeRef):
            if ref._flow is not self:
                raise ValueError(
                    f"{where}: node {ref.id!r} belongs to flow {ref._flow.workflow_id}@{ref._flow.version}, "
                    f"not {self.workflow_id}@{self.version}; reference nodes of this flow"
                )
        elif not isinstance(ref, str):
            raise TypeError(
                f"{where}: expected a NodeRef (from Flow.node) or a node id, got {type(ref).__name__}"
            )

    def _resolve(self, ref: _Ref, path: str, issues: list[ValidationIssue]) -> str:
        node_id = ref.id if isinstance(ref, NodeRef) else ref
        if node_id not in self._nodes:
            issues.append(ValidationIssue(path, f"unknown node {node_id!r}{self._hint(node_id)}"))
        return node_id

    def _hint(self, node_id: str) -> str:
        known = list(self._nodes)
        close = _close(node_id, known)
        if close or not known:
            return close
        return f"; the flow's nodes are {', '.join(map(repr, known))}"

    def _reads(self, node: Node, edges: list[Edge]) -> list[ValidationIssue]:
        """An issue for each upstream output the node's typed handler needs but the node does not get."""
        handler = self._handlers.get(node.id)
        typed = None if handler is None else handler.entry.typed
        if typed is None:
            return []
        upstream = set(node.depends_on) | {e.source for e in edges if e.target == node.id}
        issues = []
        for read in typed.upstream:
            source = next((n for n in read.node_ids() if n in upstream), None)
            mismatch = None if source is None else self._mismatch(source, read.type)
            if mismatch is not None:
                issues.append(
                    ValidationIssue(
                        f"nodes[{node.id}]",
                        f"handler {node.handler} reads the output of node {source!r} as "
                        f"{_name(read.type)} (parameter `{read.param}`), but {mismatch}",
                    )
                )
            if read.required and source is None:
                issues.append(
                    ValidationIssue(
                        f"nodes[{node.id}]",
                        f"handler {node.handler} reads the output of node {read.param!r} "
                        f"(parameter `{read.param}`), which is not upstream of it; add it to after="
                        + _close(read.param, [n for n in self._nodes if n != node.id]),
                    )
                )
        return issues

    def _mismatch(self, source: str, wanted: Any) -> str | None:
        """Why node ``source``'s declared output cannot be a ``wanted``, when both are plain classes."""
        handler = self._handlers.get(source)
        typed = None if handler is None else handler.entry.typed
        produced = None if typed is None else typed.output
        wanted_classes = [m for m in _members(wanted) if m is not type(None)]
        if not isinstance(produced, type) or produced is object:
            return None  # undeclared, Any, a union or a generic alias: the runtime checks the value
        if not all(isinstance(m, type) and m is not object for m in wanted_classes):
            return None
        if any(issubclass(produced, m) for m in wanted_classes):
            return None
        return f"its handler {handler} returns {_name(produced)}"


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _name(annotation: Any) -> str:
    return (
        annotation.__qualname__ if isinstance(annotation, type) else repr(annotation).replace("typing.", "")
    )


def _close(name: str, known: list[str]) -> str:
    """``"; did you mean 'charge'?"`` for the nearest of ``known``, or ``""``."""
    if name in known:
        return ""
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
