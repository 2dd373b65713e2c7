"""The serializable workflow specification (ADR-0032 "Serializable workflow specification").

A run pins one immutable :class:`WorkflowSpec`. Nodes name handlers by stable
name and contract version (``"review@1"``); code is never serialized. The JSON
form carries an explicit ``schema_version`` and the pinned run records the
spec's content hash (SHA-256 of its canonical JSON).

These structs only *hold* a specification; :func:`mayfly.reducer.validate`
checks it and reports every problem at once.

The content hash is a function of the specification's value alone: a field
whose JSON equals its default's is left out whatever object holds it (see
:meth:`WorkflowSpec.content_hash`).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import msgspec

from mayfly.model.errors import InvalidIdentifier, SpecDecodeError, one_line
from mayfly.model.json import JsonValue, canonical_json, content_hash
from mayfly.model.limits import MAX_HANDLER_NAME, MAX_JSON_DEPTH
from mayfly.model.outcomes import ArtifactRef, NodeOutcomeKind

__all__ = [
    "SPEC_SCHEMA_VERSION",
    "SUPPORTED_SPEC_SCHEMA_VERSIONS",
    "Backoff",
    "ChildCall",
    "ChildDefinition",
    "DependencyPolicy",
    "Edge",
    "EdgePredicate",
    "ExponentialBackoff",
    "FixedBackoff",
    "HandlerRef",
    "ImmediateBackoff",
    "Node",
    "OnAnyOutcome",
    "OnField",
    "OnOutcome",
    "RetryPolicy",
    "RunBudgets",
    "WorkflowSpec",
    "parse_handler_ref",
    "spec_difference",
]

SPEC_SCHEMA_VERSION = 1
"""The specification schema version this code writes."""

SUPPORTED_SPEC_SCHEMA_VERSIONS = frozenset({1})
"""Specification schema versions this code reads; anything else fails validation."""

DependencyPolicy: TypeAlias = Literal["all_succeeded", "all_completed", "any_succeeded"]
"""When a node with ``depends_on`` is released; ``all_succeeded`` is the safe default."""

_HANDLER_NAME = re.compile(r"[a-z][a-z0-9_.-]*")


class HandlerRef(msgspec.Struct, frozen=True):
    """A handler's stable name and contract version, written ``name@version``."""

    name: str
    version: int

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


@functools.lru_cache(maxsize=4096)
def parse_handler_ref(value: str) -> HandlerRef:
    """Parse ``name@version`` (name ``[a-z][a-z0-9_.-]*``, version a positive integer).

    Cached (a :class:`HandlerRef` is immutable): the runtime resolves a node's
    handler on every attempt. Refused values raise every time; errors are not cached.
    """
    name, sep, version = value.rpartition("@")
    if (
        not sep
        or len(name) > MAX_HANDLER_NAME
        or _HANDLER_NAME.fullmatch(name) is None
        or not version.isdigit()
        or version.startswith("0")
    ):
        raise InvalidIdentifier("handler reference", value, "expected name@version, e.g. 'review@1'")
    return HandlerRef(name, int(version))


class ImmediateBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="immediate"):
    """Retry at the virtual time the retryable outcome was committed."""


class FixedBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="fixed"):
    """Retry ``delay_ms`` after the retryable outcome was committed."""

    delay_ms: int


class ExponentialBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="exponential"):
    """Delay ``min(initial_ms * multiplier ** (next_attempt - 2), maximum_ms)``."""

    initial_ms: int = 1_000
    multiplier: int = 2
    maximum_ms: int = 60_000


Backoff: TypeAlias = ImmediateBackoff | FixedBackoff | ExponentialBackoff
"""A backoff schedule; JSON objects tagged by ``"type"``."""


class RetryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """How many attempts one activation of a node may make, and when the next one starts.

    The safe default permits three attempts and retries only
    ``retryable_failure``; ``permanent_failure`` is retried only when named
    here, and ``changes_requested`` never is (it belongs to correction edges).
    """

    max_attempts: int = 3
    retry_on: tuple[NodeOutcomeKind, ...] = (NodeOutcomeKind.RETRYABLE_FAILURE,)
    backoff: Backoff = ExponentialBackoff()
    jitter_max_ms: int = 0
    attempt_deadline_ms: int | None = None


class RunBudgets(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Run-wide ceilings; exhausting one fails the run immediately."""

    max_attempts: int = 10_000
    max_transitions: int = 100_000
    max_elapsed_ms: int | None = None


class OnAnyOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="any"):
    """Matches every final outcome of the source node's activation; JSON ``{"type": "any"}``."""


class OnOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="outcome"):
    """Matches one outcome kind; JSON ``{"type": "outcome", "outcome": "changes_requested"}``."""

    outcome: NodeOutcomeKind


class OnField(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="field"):
    """Matches a Succeeded output whose top-level ``field`` equals the scalar ``equals``.

    JSON ``{"type": "field", "field": "verdict", "equals": "ok"}``. Equality
    compares JSON type and value: ``1`` is not ``true`` and not ``1.0``; floats
    cannot be named (a spec holding one fails validation); a missing field is
    not ``null``. Any other outcome kind never matches.
    """

    field: str
    equals: str | int | bool | None


EdgePredicate: TypeAlias = OnAnyOutcome | OnOutcome | OnField
"""Data-only edge conditions; JSON objects tagged by ``"type"``."""


class Edge(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A conditional transition from ``source`` to ``target``.

    Evaluated once on the final committed outcome of each activation of
    ``source``; a match activates ``target`` (consuming one transition). Edges
    sharing an ``exclusive`` group name must share a source and be provably
    disjoint; ungrouped edges fan out in parallel, in specification order.
    Conditional edges may form correction loops (see ``docs/transitions.md``).
    """

    source: str
    target: str
    when: EdgePredicate = OnAnyOutcome()
    exclusive: str | None = None


class ChildCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Run a catalog workflow as this node's work.

    ``mode`` decides how a non-success child reads in the parent:
    ``require_success`` fails the parent node, ``propagate`` gives it the
    child's outcome class; a child's failure or cancellation is never the
    parent's success. Only the named top-level fields are copied: ``inputs``
    from the parent node's input (the run input object overlaid with the
    node's own ``input`` object) into the child run's input, ``outputs`` from
    the child run's output into the parent node's Succeeded output. A field
    the source lacks is left out, never invented as ``null``.
    """

    workflow_id: str
    version: int
    mode: Literal["propagate", "require_success"]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One unit of work: a handler (``name@version``) or a child workflow call."""

    id: str
    handler: str | None = None
    child: ChildCall | None = None
    input: JsonValue = None
    artifacts: tuple[ArtifactRef, ...] = ()
    depends_on: tuple[str, ...] = ()
    policy: DependencyPolicy = "all_succeeded"
    outputs: tuple[str, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    max_attempts: int | None = None

    @property
    def handler_ref(self) -> HandlerRef | None:
        """The parsed handler reference, or ``None`` for a child-call node."""
        return None if self.handler is None else parse_handler_ref(self.handler)


class ChildDefinition(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A reusable workflow in the root specification's closed catalog.

    ``inputs`` and ``outputs`` declare its interface: the top-level fields a
    call may copy in, and those it may copy out (each must be declared in the
    ``outputs`` of one of its nodes). Its own ``budgets`` bound its own run.
    """

    workflow_id: str
    version: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    initial: tuple[str, ...] | None = None
    budgets: RunBudgets = RunBudgets()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


class WorkflowSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An immutable, serializable workflow: nodes, edges, budgets and a child catalog.

    Every top-level field, ``schema_version`` included, is always written, so the
    version is explicit in every stored copy; nested structs omit their defaults
    so that adding an optional nested field keeps existing content hashes.

    ``initial`` lists the nodes that start the run; when omitted, every node
    without ``depends_on`` and without an incoming edge starts it. A graph
    with conditional cycles must declare it. ``catalog`` holds the child
    workflows that ``ChildCall`` nodes may run, and nothing else can be
    called. ``jitter_seed`` is pinned into retry jitter.
    """

    workflow_id: str
    version: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    initial: tuple[str, ...] | None = None
    budgets: RunBudgets = RunBudgets()
    catalog: tuple[ChildDefinition, ...] = ()
    jitter_seed: str = ""
    schema_version: int = SPEC_SCHEMA_VERSION

    def content_hash(self) -> str:
        """``sha256:<hex>`` over the canonical JSON of this spec; stable across machines.

        It depends only on the specification's value: equal specifications
        hash equally however they were built (from JSON, from Python, with a
        default spelled out or left out, with lists or tuples), and a spec
        hashes like its own JSON round trip.
        """
        return content_hash(_canonical(self))

    def matches_hash(self, recorded: str) -> bool:
        """Whether ``recorded`` is this spec's content hash, as this or an earlier Mayfly computed it.

        Before hashes were canonical, a field that held its default in a
        different object (``"budgets": {"max_attempts": 10000}`` read from
        JSON) was hashed as written; runs pinned that way still verify.
        """
        return recorded == self.content_hash() or recorded == content_hash(self)

    def to_json(self) -> bytes:
        """The spec as compact JSON (canonical: sorted keys, fields holding their default left out)."""
        return canonical_json(_canonical(self))

    @classmethod
    def from_json(cls, data: bytes | str) -> WorkflowSpec:
        """Decode a spec from JSON; anything undecodable raises :class:`SpecDecodeError` naming where.

        Unknown fields, wrong types, malformed JSON and nesting too deep to
        decode are all refused with a one-line message such as ``... at
        $.nodes[0].handler: Expected `str`, got `int```.
        """
        try:
            return _SPEC_DECODER.decode(data)
        except msgspec.ValidationError as exc:
            # msgspec ends a located message with " - at `$.nodes[0].handler`".
            problem, located, where = one_line(str(exc)).rpartition(" - at `")
            if not located:
                raise SpecDecodeError("$", where) from None
            raise SpecDecodeError(where.rstrip("`"), problem) from None
        except msgspec.DecodeError as exc:
            raise SpecDecodeError("$", one_line(str(exc))) from None
        except RecursionError:
            raise SpecDecodeError(
                "$", f"nested too deeply to decode (node inputs may nest at most {MAX_JSON_DEPTH} levels)"
            ) from None


_SPEC_DECODER = msgspec.json.Decoder(WorkflowSpec)


# -- the canonical form ----------------------------------------------------------------
#
# msgspec's ``omit_defaults`` leaves a field out only when it holds the very object that is
# its default. ``Node(policy=json.loads('"all_succeeded"'))``, ``RunBudgets(max_attempts=
# int("10000"))``, a fresh ``ExponentialBackoff()`` or ``depends_on=[]`` are written out,
# while the same spec decoded from JSON, where msgspec fills in the default object, is not:
# equal specifications would hash differently, and a run would not verify after its own
# journal round trip. The canonical form swaps every field whose JSON equals its default's
# JSON for the default object itself, so encoding it depends on the value alone.
#
# Which fields to look at is derived from the struct definitions, once: the defaulted fields
# of each ``omit_defaults`` struct, and every field that may hold such a struct deeper down.
# A field whose default is ``None`` needs no look: only ``None`` encodes as ``null`` (NaN
# does too, but validation refuses a spec that does not survive its JSON round trip).
#
# Specs are hashed on every run creation and resume, and a spec may have 100,000 nodes, so
# each struct type gets a generated function (as dataclasses and attrs generate __init__):
# in the common case it costs one identity check per looked-at field, and a sub-struct that
# many nodes share is looked at once.

_SCALAR, _EMPTY, _VALUE, _STRUCT, _ITEMS = range(5)
"""How a field is looked at: a str/int/bool default; a ``()`` default; any other default,
compared by JSON; a field that may hold a looked-at struct; a tuple of such structs."""

_Plan = tuple[tuple[str, Any, int], ...]
"""Per struct type: (field name, default or ``_REQUIRED``, how it is looked at)."""

_Canonicalize: TypeAlias = Callable[[Any, list[dict[int, Any]]], Any]
_Infos: TypeAlias = "dict[type[msgspec.Struct], msgspec.inspect.StructType]"

_REQUIRED: Any = msgspec.NODEFAULT
_JSON_TYPES = (str, int, float, bool, type(None), list, tuple, dict)
_ENCODER = msgspec.json.Encoder(order="sorted")


def _struct_types(info: msgspec.inspect.Type) -> list[msgspec.inspect.StructType]:
    if isinstance(info, msgspec.inspect.StructType):
        return [info]
    if isinstance(info, msgspec.inspect.UnionType):
        return [s for t in info.types for s in _struct_types(t)]
    if isinstance(info, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return _struct_types(info.item_type)
    return []


def _how(field: msgspec.inspect.Field, planned: dict[type[msgspec.Struct], _Plan], omit: bool) -> int | None:
    if any(s.cls in planned for s in _struct_types(field.type)):
        return _ITEMS if isinstance(field.type, msgspec.inspect.VarTupleType) else _STRUCT
    default = field.default
    if not omit or default is _REQUIRED or default is None:
        return None
    if type(default) in (str, int, bool):
        return _SCALAR
    return _EMPTY if default == () else _VALUE


def _reachable(root: type[msgspec.Struct]) -> _Infos:
    infos: _Infos = {}
    pending = _struct_types(msgspec.inspect.type_info(root))
    while pending:
        info = pending.pop()
        if info.cls not in infos:
            infos[info.cls] = info
            pending.extend(s for field in info.fields for s in _struct_types(field.type))
    return infos


def _plans(infos: _Infos) -> dict[type[msgspec.Struct], _Plan]:
    plans: dict[type[msgspec.Struct], _Plan] = {}
    changed = True
    while changed:  # a field needs a look if a struct it may hold does: iterate to a fixpoint
        changed = False
        for cls, info in infos.items():
            omit = cls.__struct_config__.omit_defaults
            plan = tuple(
                (field.name, field.default, how)
                for field in info.fields
                if (how := _how(field, plans, omit)) is not None
            )
            if plan and plans.get(cls) != plan:
                plans[cls] = plan
                changed = True
    return plans


def _is_plain_default(default: Any, infos: _Infos) -> bool:
    """Whether ``default`` is an omit_defaults struct holding every field's own default object.

    A canonical value of its type then equals it exactly when each of its
    fields is that field's default object: a run of identity checks.
    """
    info = infos.get(type(default))
    return (
        info is not None
        and type(default).__struct_config__.omit_defaults
        and all(f.default is not _REQUIRED and getattr(default, f.name) is f.default for f in info.fields)
    )


def _compile(cls: type[msgspec.Struct], plan: _Plan, infos: _Infos, first_memo: int) -> _Canonicalize:
    """The canonicalising function of one struct type: unrolled checks, one per planned field."""
    env: dict[str, Any] = {"_same_json": _same_json, "_replace": msgspec.structs.replace}
    env |= {"_items": _items, "_CANONICAL": _CANONICAL}
    lines = ["def canonical(obj, memos):", "    changes = None"]
    for k, (name, default, how) in enumerate(plan):
        d = f"_d{k}"
        env[d] = default
        lines.append(f"    value = obj.{name}")
        if how == _SCALAR:
            lines.append(f"    if value is not {d} and (type(value) is not type({d}) or value == {d}):")
            lines.append(f"        new = {d} if _same_json(value, {d}) else value")
        elif how == _EMPTY:
            lines.append(f"    if value is not {d} and type(value) is not tuple:  # () is a singleton")
            lines.append(f"        new = {d} if _same_json(value, {d}) else value")
        elif how == _ITEMS:
            lines.append(f"    if value is not {d}:")
            lines.append("        new = _items(value, memos)")
            if default is not _REQUIRED:
                lines.append(f"        if not new:\n            new = {d}")
        else:
            lines.append(f"    if value is not {d}:")
            lines.append(f"        memo = memos[{first_memo + k}]")
            lines.append("        new = memo.get(id(value))")
            lines.append("        if new is None:")
            if how == _STRUCT:
                lines.append("            canonicalize = _CANONICAL.get(type(value))")
                lines.append(
                    "            new = value if canonicalize is None else canonicalize(value, memos)"
                )
            else:
                lines.append("            new = value")
            if default is None or default is _REQUIRED:
                pass  # only None is None, and a required field has no default to become
            elif _is_plain_default(default, infos):
                fields = infos[type(default)].fields
                env |= {f"_d{k}_{f.name}": f.default for f in fields}
                same = " and ".join(f"new.{f.name} is _d{k}_{f.name}" for f in fields)
                lines.append(f"            if type(new) is type({d}) and {same}:")
                lines.append(f"                new = {d}")
            else:
                lines.append(f"            if _same_json(new, {d}):")
                lines.append(f"                new = {d}")
            lines.append("            memo[id(value)] = new")
        lines.append("        if new is not value:")
        lines.append("            if changes is None:")
        lines.append("                changes = {}")
        lines.append(f"            changes[{name!r}] = new")
    lines.append("    return obj if changes is None else _replace(obj, **changes)")
    exec("\n".join(lines), env)  # source generated from our own struct definitions
    function: _Canonicalize = env["canonical"]
    return function


def _struct(obj: Any, memos: list[dict[int, Any]]) -> Any:
    canonical = _CANONICAL.get(type(obj))
    return obj if canonical is None else canonical(obj, memos)


def _items(value: Any, memos: list[dict[int, Any]]) -> Any:
    if not isinstance(value, list | tuple) or not value:
        return value
    # The items of a tuple field (nodes, edges) nearly always share one type: look it up once.
    kind = type(value[0])
    canonicalize = _CANONICAL.get(kind)
    if canonicalize is None:
        canonical = [_struct(item, memos) for item in value]
    else:
        canonical = [
            canonicalize(item, memos) if type(item) is kind else _struct(item, memos) for item in value
        ]
    if type(value) is tuple and all(map(operator.is_, canonical, value)):
        return value
    return tuple(canonical)


def _canonical(spec: WorkflowSpec) -> WorkflowSpec:
    """``spec`` with every field that JSON-equals its default holding the default object itself.

    Returns ``spec`` itself, not a copy, when nothing needs replacing. Each
    struct-valued field has its own memo (by the identity of the value), so
    a value shared by many nodes is canonicalised once.
    """
    result: WorkflowSpec = _struct(spec, [{} for _ in range(_MEMOS)])
    return result


def spec_difference(spec: WorkflowSpec, other: WorkflowSpec) -> str | None:
    """``None`` if both specs have the same canonical JSON, else the path of the first difference.

    The path names fields by name and list items by position, or by id for
    nodes (``nodes[review].max_attempts``); it is ``""`` when the two differ
    only as wholes.
    """
    a, b = _canonical(spec), _canonical(other)
    if canonical_json(a) == canonical_json(b):
        return None
    return _locate(a, b, "")


def _locate(a: Any, b: Any, path: str) -> str:
    if isinstance(a, msgspec.Struct) and type(a) is type(b):
        for name in type(a).__struct_fields__:
            if _written(a, name) != _written(b, name):
                return _locate(getattr(a, name), getattr(b, name), f"{path}.{name}" if path else name)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if canonical_json(x) != canonical_json(y):
                label = x.id if isinstance(x, Node) and isinstance(x.id, str) else i
                return _locate(x, y, f"{path}[{label}]")
    return path


def _written(struct: Any, name: str) -> bytes | None:
    """The JSON a canonical struct writes for field ``name``, or ``None`` if it leaves it out."""
    value = getattr(struct, name)
    plan = _PLAN_DEFAULTS.get((type(struct), name), _REQUIRED)
    return None if value is plan else canonical_json(value)


def _same_json(value: Any, default: Any) -> bool:
    """Whether ``value`` encodes to the same JSON as ``default`` (``value`` already canonical)."""
    if value is default:
        return True
    if value is None or default is None:
        return False
    kind = type(default)
    if type(value) is kind:
        if kind is str or kind is int or kind is bool:
            return bool(value == default)
        if kind is tuple:
            return len(value) == len(default) and all(map(_same_json, value, default))
        if issubclass(kind, msgspec.Struct):
            return all(
                _same_json(getattr(value, name), getattr(default, name)) for name in kind.__struct_fields__
            )
    elif isinstance(value, list | tuple) and isinstance(default, list | tuple):
        return len(value) == len(default) and all(map(_same_json, value, default))
    elif isinstance(value, _JSON_TYPES) and isinstance(default, _JSON_TYPES):
        return False  # the JSON types differ: 1 is neither true nor 1.0
    # An enum, a subclass, another struct type: compare what they encode to.
    try:
        return bool(_ENCODER.encode(value) == _ENCODER.encode(default))
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
        return False


def _compile_all(root: type[msgspec.Struct]) -> int:
    """Fill :data:`_CANONICAL` for every struct type reachable from ``root``; return the memo count."""
    infos = _reachable(root)
    memos = 0
    for cls, plan in _plans(infos).items():
        _CANONICAL[cls] = _compile(cls, plan, infos, memos)
        memos += len(plan)
    return memos


_CANONICAL: dict[type[msgspec.Struct], _Canonicalize] = {}
_MEMOS = _compile_all(WorkflowSpec)
_PLAN_DEFAULTS = {
    (cls, name): default
    for cls, info in _reachable(WorkflowSpec).items()
    if cls.__struct_config__.omit_defaults
    for name, default in ((f.name, f.default) for f in info.fields)
}
