"""Specification validation: every problem at once, each located by its path.

Edges must name known nodes; exclusive groups must share a source and be
provably disjoint (:func:`mayfly.reducer.transitions.overlap_reason`); a
graph whose dependencies plus edges form a cycle must declare ``initial``.
Child calls must name a catalog entry and only fields it declares; the call
graph must not recurse or nest more than eight levels.

Paths name nodes by id where the id is usable (``nodes[review].depends_on[2]``)
and by position otherwise (``nodes[3].id``), so an author can find the
problem in the JSON or the Python that produced it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import msgspec

from mayfly.model.errors import (
    InvalidIdentifier,
    InvalidJSONValue,
    LimitExceeded,
    SpecValidationError,
    ValidationIssue,
)
from mayfly.model.ids import NODE_ID_GRAMMAR, is_node_id, parse_workflow_id
from mayfly.model.json import canonical_json, check_json_value
from mayfly.model.limits import MAX_EVIDENCE_REFS, MAX_INLINE_INPUT_BYTES, MAX_JSON_DEPTH, MAX_NODES
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.spec import (
    SUPPORTED_SPEC_SCHEMA_VERSIONS,
    ChildCall,
    ChildDefinition,
    Edge,
    ExponentialBackoff,
    FixedBackoff,
    Node,
    OnField,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
    parse_handler_ref,
    spec_difference,
)
from mayfly.reducer.children import call_graph_issues
from mayfly.reducer.transitions import describe_predicate, first_overlaps, overlap_reason

__all__ = ["check_input", "ensure_valid", "validate", "validate_and_hash"]

_Add = Callable[[ValidationIssue], None]

_RETRYABLE_CLASSES = frozenset({NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE})
_JSON = msgspec.json.Encoder()
_MAX_OUTPUT_NAME = 64


def check_input(value: object, what: str = "input") -> None:
    """Raise if ``value`` cannot be stored as JSON and read back unchanged, or is over 64 KiB.

    :class:`InvalidJSONValue` if it is not JSON (unserializable, a NaN, an
    integer longer than 4,300 digits); :class:`LimitExceeded` if it nests
    deeper than 128 levels or its compact JSON is over 64 KiB. Both are
    ``ValueError`` subclasses.
    """
    if value is None:
        return  # most node inputs: nothing to check
    check_json_value(value, what)  # first: it bounds the depth the encoder recurses to
    try:
        size = len(_JSON.encode(value))
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        raise InvalidJSONValue(f"{what} is not JSON-serializable: {exc}") from None
    if size > MAX_INLINE_INPUT_BYTES:
        raise LimitExceeded(f"inline {what} (use artifact references)", MAX_INLINE_INPUT_BYTES, size)


def ensure_valid(spec: WorkflowSpec) -> WorkflowSpec:
    """Return ``spec`` if valid, else raise :class:`SpecValidationError` listing every issue."""
    issues = validate(spec)
    if issues:
        raise SpecValidationError(issues)
    return spec


def validate(spec: WorkflowSpec) -> list[ValidationIssue]:
    """Every problem in ``spec``, in a stable order; an empty list means valid.

    Catalog definitions are checked like the root (paths start with
    ``catalog[id@version].``), and so are the child calls that reference
    them: an unknown reference, recursion or nesting deeper than eight
    levels is reported before any run exists.
    """
    return validate_and_hash(spec)[0]


def validate_and_hash(spec: WorkflowSpec) -> tuple[list[ValidationIssue], str | None]:
    """:func:`validate`, and the spec's content hash (``None`` if it has no JSON form to hash).

    The hash is :meth:`WorkflowSpec.content_hash`, computed over the same
    canonical JSON the validation writes, so creating a run hashes its spec
    once. A spec equal to one decoded from a canonical JSON validated
    before (a runtime validates before it creates the run, and creating
    validates again; an application submits one spec many times) is answered
    from a small memo: whether it reads back unchanged, its hash and its
    graph's issues depend only on that JSON then. A spec that JSON does not
    show exactly (a NaN, which the encoder writes as ``null``) is never
    equal to the decoded one, so it is checked in full every time.
    """
    # Python-built structs skip msgspec's type checks; a JSON round trip applies them
    # with located messages ("Expected `int`, got `str` - at `$.nodes[0].retry`"). The
    # run's history holds exactly that JSON, so a spec must also read back from it with
    # the same content: a NaN or an object JSON cannot hold would otherwise run live as
    # one value and replay as another.
    try:
        written = spec.to_json()
        digest = hashlib.sha256(written)
        known = _CHECKED.get(digest.digest())
        if known is not None and known[0] == spec:
            return list(known[1]), "sha256:" + digest.hexdigest()
        decoded = msgspec.json.decode(written, type=WorkflowSpec)
        # ``written`` leaves out exactly the fields that equal their defaults, and those decode as
        # the default objects themselves: the decoded spec encodes as ``written`` again, as it is,
        # unless a value changed on the way.
        difference = None if canonical_json(decoded) == written else spec_difference(spec, decoded)
    except (msgspec.ValidationError, msgspec.EncodeError, TypeError, ValueError) as exc:
        return [ValidationIssue("", f"malformed specification: {exc}")], None
    except RecursionError:
        return [
            ValidationIssue(
                "",
                "malformed specification: nested too deeply to encode as JSON "
                f"(node inputs may nest at most {MAX_JSON_DEPTH} levels)",
            )
        ], None
    if difference is not None:
        return [
            ValidationIssue(
                difference,
                "does not read back unchanged from its own JSON: it holds a value JSON cannot "
                "represent (a NaN or infinity, an object that is not a JSON value)",
            )
        ], None
    spec_hash = "sha256:" + digest.hexdigest()
    if decoded != spec:
        # Values the JSON does not show as they are (a NaN input reads back as null): the graph checks
        # look at this spec itself, never at a memo of its JSON's twin.
        return _check_graph(spec), spec_hash
    # A spec too large to keep decoded has only its graph's issues remembered (known[0] is None).
    checked = known[1] if known is not None else tuple(_check_graph(spec))
    _CHECKED[digest.digest()] = (decoded if len(written) <= _KEPT_BYTES else None, checked)
    if len(_CHECKED) > _CHECKED_LIMIT:
        del _CHECKED[next(iter(_CHECKED))]  # the oldest
    return list(checked), spec_hash


# Specs validated lately, by the SHA-256 of their canonical JSON: the spec decoded from it and its
# graph's issues. For a spec equal to that decoded one, whether it reads back unchanged, its hash and
# its issues are all functions of that JSON, so what the memo returns never depends on what was checked
# before, and an application that submits one spec many times pays its decode, re-encode and graph
# checks once. Bounded in entries; a spec whose JSON is over _KEPT_BYTES is not kept decoded.
_CHECKED: dict[bytes, tuple[WorkflowSpec | None, tuple[ValidationIssue, ...]]] = {}
_CHECKED_LIMIT = 64
_KEPT_BYTES = 64 * 1024


def _check_graph(spec: WorkflowSpec) -> list[ValidationIssue]:
    """Every problem of a spec that reads back unchanged from its JSON (see :func:`validate`)."""
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
    catalog = _check_catalog(spec, add)
    before = len(issues)
    _check_body("", spec.nodes, edges=spec.edges, initial=spec.initial, catalog=catalog, add=add)
    root = (spec.workflow_id, spec.version)
    for position, entry in enumerate(spec.catalog):
        key = (entry.workflow_id, entry.version)
        prefix = (
            f"catalog[{entry.workflow_id}@{entry.version}]." if key in catalog else f"catalog[{position}]."
        )
        _check_interface(entry, prefix, add)
        if key == root:
            if (entry.nodes, entry.edges, entry.initial, entry.budgets) != (
                spec.nodes,
                spec.edges,
                spec.initial,
                spec.budgets,
            ):
                add(
                    ValidationIssue(
                        prefix.rstrip("."),
                        "has this workflow's own id and version but a different definition",
                    )
                )
            continue
        _check_budgets(entry.budgets, f"{prefix}budgets", add)
        _check_body(prefix, entry.nodes, edges=entry.edges, initial=entry.initial, catalog=catalog, add=add)
    if len(issues) == before and len(catalog) == len(spec.catalog):
        # The call graph is meaningful only once every reference resolves.
        issues.extend(call_graph_issues(spec))
    return issues


_Key = tuple[str, int]


def _check_catalog(spec: WorkflowSpec, add: _Add) -> dict[_Key, ChildDefinition]:
    catalog: dict[_Key, ChildDefinition] = {}
    for position, entry in enumerate(spec.catalog):
        path = f"catalog[{position}]"
        try:
            parse_workflow_id(entry.workflow_id)
        except InvalidIdentifier as exc:
            add(ValidationIssue(f"{path}.workflow_id", str(exc)))
            continue
        if entry.version < 1:
            add(ValidationIssue(f"{path}.version", f"must be >= 1, got {entry.version}"))
            continue
        key = (entry.workflow_id, entry.version)
        if key in catalog:
            add(
                ValidationIssue(
                    path,
                    f"duplicate catalog entry {entry.workflow_id}@{entry.version}; versions are immutable",
                )
            )
            continue
        catalog[key] = entry
    return catalog


def _check_names(names: tuple[str, ...], path: str, what: str, add: _Add) -> None:
    seen: set[str] = set()
    for j, name in enumerate(names):
        if not name or len(name) > _MAX_OUTPUT_NAME or not name.isascii() or not name.isprintable():
            add(ValidationIssue(f"{path}[{j}]", f"invalid {what} name {name!r}"))
        elif name in seen:
            add(ValidationIssue(f"{path}[{j}]", f"duplicate {what} name {name!r}"))
        seen.add(name)


def _check_interface(entry: ChildDefinition, prefix: str, add: _Add) -> None:
    _check_names(entry.inputs, f"{prefix}inputs", "input", add)
    _check_names(entry.outputs, f"{prefix}outputs", "output", add)
    declared = {name for node in entry.nodes for name in node.outputs}
    for j, name in enumerate(entry.outputs):
        if name not in declared:
            add(
                ValidationIssue(
                    f"{prefix}outputs[{j}]", f"output {name!r} is not declared in the outputs of any node"
                )
            )


def _check_body(
    prefix: str,
    nodes: tuple[Node, ...],
    *,
    edges: tuple[Edge, ...],
    initial: tuple[str, ...] | None,
    catalog: dict[_Key, ChildDefinition],
    add: _Add,
) -> None:
    """Nodes, dependencies, edges, initial set and graph shape of the root or one catalog entry."""
    if not nodes:
        add(ValidationIssue(f"{prefix}nodes", "a workflow needs at least one node"))
        return
    if len(nodes) > MAX_NODES:
        add(ValidationIssue(f"{prefix}nodes", f"{len(nodes)} nodes, over the limit of {MAX_NODES}"))
        return

    ids: dict[str, int] = {}
    for position, node in enumerate(nodes):
        label = node.id if is_node_id(node.id) else str(position)
        path = f"{prefix}nodes[{label}]"
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
        _check_node(node, path, catalog, add)

    for node in nodes:
        path = f"{prefix}nodes[{node.id}]" if is_node_id(node.id) else f"{prefix}nodes[?]"
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

    if initial is not None:
        if not initial:
            add(ValidationIssue(f"{prefix}initial", "when given, initial must name at least one node"))
        seen_initial: set[str] = set()
        for j, node_id in enumerate(initial):
            if node_id not in ids:
                add(ValidationIssue(f"{prefix}initial[{j}]", f"unknown node {node_id!r}"))
            elif node_id in seen_initial:
                add(ValidationIssue(f"{prefix}initial[{j}]", f"duplicate initial node {node_id!r}"))
            seen_initial.add(node_id)

    edges_ok = _check_edges(prefix, nodes, edges, ids, add)

    # Cycle and reachability analysis needs well-formed ids and references.
    if (
        edges_ok
        and len(ids) == len(nodes)
        and all(prereq in ids and prereq != node.id for node in nodes for prereq in node.depends_on)
    ):
        for issue in _graph_issues(prefix, nodes, edges, initial, ids):
            add(issue)


def _check_edges(
    prefix: str, nodes: tuple[Node, ...], edges: tuple[Edge, ...], ids: dict[str, int], add: _Add
) -> bool:
    """Edge references, field names and exclusive-group disjointness; whether every reference resolves."""
    ok = True
    groups: dict[str, list[int]] = {}
    for k, edge in enumerate(edges):
        path = f"{prefix}edges[{k}]"
        for end in ("source", "target"):
            node_id = getattr(edge, end)
            if node_id not in ids:
                add(ValidationIssue(f"{path}.{end}", f"unknown node {node_id!r}"))
                ok = False
        when = edge.when
        if isinstance(when, OnField):
            name = when.field
            if not name or len(name) > _MAX_OUTPUT_NAME or not name.isascii() or not name.isprintable():
                add(ValidationIssue(f"{path}.when.field", f"invalid field name {name!r}"))
            elif edge.source in ids:
                declared = nodes[ids[edge.source]].outputs
                if declared and name not in declared:
                    add(
                        ValidationIssue(
                            f"{path}.when.field",
                            f"node {edge.source!r} does not declare output {name!r} "
                            f"(declared: {', '.join(declared)})",
                        )
                    )
        if edge.exclusive is not None:
            if not edge.exclusive:
                add(ValidationIssue(f"{path}.exclusive", "an exclusive group name must not be empty"))
            else:
                groups.setdefault(edge.exclusive, []).append(k)
    for group, members in groups.items():
        first = edges[members[0]]
        for k in members[1:]:
            if edges[k].source != first.source:
                add(
                    ValidationIssue(
                        f"{prefix}edges[{k}].exclusive",
                        f"exclusive group {group!r} mixes sources {first.source!r} "
                        f"(edges[{members[0]}]) and {edges[k].source!r}; a group belongs to one source",
                    )
                )
        # One issue per overlapping edge, naming its earliest overlapping partner: linear in the group.
        for a, b in first_overlaps([edges[k].when for k in members]):
            j, k = members[a], members[b]
            reason = overlap_reason(edges[j].when, edges[k].when)
            add(
                ValidationIssue(
                    f"{prefix}edges[{k}]",
                    f"overlaps edges[{j}] in exclusive group {group!r}: "
                    f"edges[{j}] ({_describe(edges[j])}) and edges[{k}] ({_describe(edges[k])}) "
                    f"can both match because {reason}",
                )
            )
    return ok


def _describe(edge: Edge) -> str:
    return f"{edge.source} -> {edge.target} on {describe_predicate(edge.when)}"


def _check_budgets(budgets: RunBudgets, path: str, add: _Add) -> None:
    if budgets.max_attempts < 1:
        add(ValidationIssue(f"{path}.max_attempts", f"must be >= 1, got {budgets.max_attempts}"))
    if budgets.max_transitions < 1:
        add(ValidationIssue(f"{path}.max_transitions", f"must be >= 1, got {budgets.max_transitions}"))
    if budgets.max_elapsed_ms is not None and budgets.max_elapsed_ms < 1:
        add(ValidationIssue(f"{path}.max_elapsed_ms", f"must be >= 1, got {budgets.max_elapsed_ms}"))


def _check_node(node: Node, path: str, catalog: dict[_Key, ChildDefinition], add: _Add) -> None:
    if node.child is not None:
        if node.handler is not None:
            add(ValidationIssue(path, "a node has a handler or a child call, not both"))
        _check_child_call(node, node.child, f"{path}.child", catalog, add)
    elif node.handler is None:
        add(ValidationIssue(f"{path}.handler", "a node needs a handler ('name@version')"))
    if node.handler is not None:
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
    _check_names(node.outputs, f"{path}.outputs", "output", add)
    if node.max_attempts is not None and node.max_attempts < 1:
        add(ValidationIssue(f"{path}.max_attempts", f"must be >= 1, got {node.max_attempts}"))
    _check_retry(node.retry, f"{path}.retry", add)


def _check_child_call(
    node: Node, call: ChildCall, path: str, catalog: dict[_Key, ChildDefinition], add: _Add
) -> None:
    try:
        parse_workflow_id(call.workflow_id)
    except InvalidIdentifier as exc:
        add(ValidationIssue(f"{path}.workflow_id", str(exc)))
        return
    _check_names(call.inputs, f"{path}.inputs", "input", add)
    _check_names(call.outputs, f"{path}.outputs", "output", add)
    entry = catalog.get((call.workflow_id, call.version))
    if entry is None:
        known = ", ".join(f"{w}@{v}" for w, v in catalog) or "none"
        add(
            ValidationIssue(
                path,
                f"calls {call.workflow_id}@{call.version}, which is not in the catalog (known: {known})",
            )
        )
        return
    for j, name in enumerate(call.inputs):
        if name not in entry.inputs:
            add(
                ValidationIssue(
                    f"{path}.inputs[{j}]",
                    f"{call.workflow_id}@{call.version} does not declare input {name!r}",
                )
            )
    for j, name in enumerate(call.outputs):
        if name not in entry.outputs:
            add(
                ValidationIssue(
                    f"{path}.outputs[{j}]",
                    f"{call.workflow_id}@{call.version} does not declare output {name!r}",
                )
            )
        elif node.outputs and name not in node.outputs:
            add(
                ValidationIssue(
                    f"{path}.outputs[{j}]",
                    f"node {node.id!r} does not declare output {name!r} in its own outputs",
                )
            )


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


def _graph_issues(
    prefix: str,
    nodes: tuple[Node, ...],
    edges: tuple[Edge, ...],
    initial: tuple[str, ...] | None,
    ids: dict[str, int],
) -> Iterable[ValidationIssue]:
    """Cycles among unconditional dependencies, undeclared conditional cycles, unreachable nodes."""
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
            f"{prefix}nodes", f"dependency cycle among unconditional depends_on edges through: {shown}"
        )
        return
    targets = {edge.target for edge in edges}
    if initial is None:
        cyclic = _conditional_cycle(nodes, edges, ids, dependents)
        if cyclic:
            shown = ", ".join(cyclic[:10]) + (", ..." if len(cyclic) > 10 else "")
            yield ValidationIssue(
                f"{prefix}initial",
                f"the graph has a conditional cycle through: {shown}; declare the initial nodes explicitly",
            )
        return
    starts = set(initial)
    for node in nodes:
        if not node.depends_on and node.id not in starts and node.id not in targets:
            yield ValidationIssue(
                f"{prefix}nodes[{node.id}]",
                "can never become ready: not in initial, no depends_on and no incoming edge",
            )


def _conditional_cycle(
    nodes: tuple[Node, ...], edges: tuple[Edge, ...], ids: dict[str, int], dependents: list[list[int]]
) -> list[str]:
    """Nodes on (or between) cycles of dependencies plus edges, in specification order; empty if acyclic."""
    forward: list[list[int]] = [list(d) for d in dependents]
    for edge in edges:
        forward[ids[edge.source]].append(ids[edge.target])
    backward: list[list[int]] = [[] for _ in nodes]
    for i, outs in enumerate(forward):
        for j in outs:
            backward[j].append(i)

    def residue(graph: list[list[int]], reverse: list[list[int]]) -> set[int]:
        indegree = [len(ins) for ins in reverse]
        queue = [i for i, degree in enumerate(indegree) if degree == 0]
        while queue:
            i = queue.pop()
            for j in graph[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    queue.append(j)
        return {i for i, degree in enumerate(indegree) if degree > 0}

    on_cycles = residue(forward, backward) & residue(backward, forward)
    return [nodes[i].id for i in sorted(on_cycles)]
