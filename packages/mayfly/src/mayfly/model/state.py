"""Run state derived from history: node and run statuses, counters and indexes.

The state is the reducer's working memory. It is mutable on purpose: copying
a 100k-node graph per event would make replay quadratic, so ``reduce`` updates
the one state it owns in place and keeps per-node dependency counters, so that
every event costs work proportional to the nodes it touches, never to the
graph. :meth:`RunState.to_record` gives the immutable, serializable form used
by snapshots and golden fixtures; :meth:`RunState.from_record` rebuilds the
indexes from it.
"""

from __future__ import annotations

import enum
import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar, overload

import msgspec
import msgspec.structs

from mayfly.model.events import (
    BudgetExhausted,
    CancellationRequested,
    FailureCause,
    LastOutcome,
    ParentLink,
)
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcome
from mayfly.model.signals import AcceptedSignal, ConsumedSignal, SignalWait
from mayfly.model.spec import Node, WorkflowSpec

__all__ = [
    "STATE_SCHEMA_VERSION",
    "AttemptRecord",
    "NodeDetail",
    "NodeRecord",
    "NodeState",
    "NodeStatus",
    "RunState",
    "RunStateRecord",
    "RunStatus",
    "collector_paused",
    "compile_assign",
    "count_terminal",
    "is_parked",
    "uncount_terminal",
]

_T = TypeVar("_T")

STATE_SCHEMA_VERSION = 1
"""Version of :class:`RunStateRecord`, the serialized state."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large state is built, restored or replayed.

    Building a state allocates one object per node (and restoring or
    replaying, one per attempt and outcome), none of them cyclic garbage; in
    a process with a large heap each collection those allocations trigger
    walks the whole heap, which made a 100k-node state cost 1.7x its own work
    and every event of a long replay cost more than the same event of a short
    one (msgpack's documentation gives the same advice for large messages).
    Only re-enabled if it was enabled on entry; results never depend on it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class NodeStatus(enum.Enum):
    """The node states of ADR-0032's state diagram."""

    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    RETRY_PENDING = "retry_pending"
    CHANGES_REQUESTED = "changes_requested"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    # cached_property: after the first read these are plain attribute loads on the
    # member, which keeps the reducer's per-event bookkeeping cheap.
    @functools.cached_property
    def is_terminal(self) -> bool:
        """Whether the node has a final status (only a conditional edge can re-activate it)."""
        return self in _TERMINAL

    @functools.cached_property
    def is_idle(self) -> bool:
        """Whether an open node waits for something else (Pending, ChangesRequested).

        A run whose open nodes are all idle can never receive another outcome:
        it is quiescent, and its parked nodes are resolved (docs/transitions.md).
        """
        return self is _PENDING or self is _CHANGES_REQUESTED


_TERMINAL = frozenset(
    {
        NodeStatus.SUCCEEDED,
        NodeStatus.FAILED,
        NodeStatus.BLOCKED,
        NodeStatus.CANCELLED,
        NodeStatus.SKIPPED,
    }
)


class RunStatus(enum.Enum):
    """A run is running until its terminal result is recorded."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"

    @functools.cached_property
    def is_terminal(self) -> bool:
        """Whether the run has its terminal result (an attribute load after the first read)."""
        return self is not _RUN_RUNNING


# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_BLOCKED = NodeStatus.BLOCKED
_CANCELLED = NodeStatus.CANCELLED
_CHANGES_REQUESTED = NodeStatus.CHANGES_REQUESTED
_FAILED = NodeStatus.FAILED
_PENDING = NodeStatus.PENDING
_READY = NodeStatus.READY
_RUN_RUNNING = RunStatus.RUNNING
_SKIPPED = NodeStatus.SKIPPED
_SUCCEEDED = NodeStatus.SUCCEEDED
_WAITING = NodeStatus.WAITING


class NodeDetail:
    """The rarely set part of a :class:`NodeState`, created only for a node that needs it.

    Most nodes of a large run never wait, retry, call a child, fail with a
    cause or take part in an edge; keeping these fields out of every node
    saved a finished run about 100 B per node. A node gets one when one of
    them is first set to a value other than its default, or when it is built
    with edges, and keeps it. The replay's fast rules
    (:mod:`mayfly.reducer._fast`) only take nodes without one.
    """

    __slots__ = (
        "blocked_prereqs",
        "cancelled_prereqs",
        "child_run_id",
        "closed_in",
        "edge_targets",
        "failure",
        "in_edges",
        "out_edges",
        "outcome_seq",
        "paused_deadline",
        "retry_deadline",
        "signal",
        "wait",
        "wait_expired",
    )

    def __init__(self) -> None:
        self.retry_deadline: int | None = None
        self.failure: FailureCause | None = None
        self.blocked_prereqs = 0
        self.cancelled_prereqs = 0
        self.out_edges: tuple[int, ...] = ()
        self.edge_targets: tuple[int, ...] = ()
        self.in_edges = 0
        self.closed_in = 0
        self.outcome_seq = 0
        self.child_run_id: str | None = None
        self.wait: SignalWait | None = None
        self.signal: AcceptedSignal | None = None
        self.paused_deadline: int | None = None
        self.wait_expired = False

    def copy(self) -> NodeDetail:
        """A shallow copy (every field holds an immutable value)."""
        return _copy_detail(self)


class _Detail(Generic[_T]):
    """A :class:`NodeState` attribute stored in its :class:`NodeDetail` (its default while it has none)."""

    __slots__ = ("default", "name")

    def __init__(self, default: _T) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, node: None, owner: type[Any]) -> _Detail[_T]: ...
    @overload
    def __get__(self, node: NodeState, owner: type[Any]) -> _T: ...
    def __get__(self, node: NodeState | None, owner: type[Any]) -> _T | _Detail[_T]:
        if node is None:
            return self
        detail = node.detail
        if detail is None:
            return self.default
        value: _T = getattr(detail, self.name)
        return value

    def __set__(self, node: NodeState, value: _T) -> None:
        detail = node.detail
        if detail is None:
            if value == self.default:
                return
            detail = node.detail = NodeDetail()
        setattr(detail, self.name, value)


class NodeState:
    """The mutable state of one node inside :class:`RunState`.

    The fields every attempt touches are slots of their own; the rest live in
    a :class:`NodeDetail` created on first use (``detail``), behind attributes
    of the same names, so that a node that only ran and finished stays small.
    """

    __slots__ = (
        "attempt",
        "attempt_deadline",
        "attempt_id",
        "dependents",
        "detail",
        "done_prereqs",
        "index",
        "last_outcome",
        "prereqs",
        "spec",
        "status",
        "succeeded_prereqs",
        "total_attempts",
    )

    retry_deadline = _Detail[int | None](None)
    failure = _Detail[FailureCause | None](None)
    blocked_prereqs = _Detail[int](0)
    cancelled_prereqs = _Detail[int](0)
    out_edges = _Detail[tuple[int, ...]](())
    """Positions of the edges leaving this node, in specification order."""
    edge_targets = _Detail[tuple[int, ...]](())
    """The target node index of each edge in ``out_edges``."""
    in_edges = _Detail[int](0)
    """How many edges enter this node."""
    closed_in = _Detail[int](0)
    """Incoming edges that can never fire again: their source finished and has no incoming edge."""
    outcome_seq = _Detail[int](0)
    """Sequence of the outcome that ended this node's last activation (tracked for edge sources)."""
    child_run_id = _Detail[str | None](None)
    """The child run of the active attempt, until its completion is recorded."""
    wait = _Detail[SignalWait | None](None)
    """The open durable wait of the active attempt (status Waiting)."""
    signal = _Detail[AcceptedSignal | None](None)
    """The signal the active attempt accepted; the resumed handler receives it."""
    paused_deadline = _Detail[int | None](None)
    """Milliseconds left on the attempt deadline, paused while the node waits."""
    wait_expired = _Detail[bool](False)
    """Whether this node's last wait ended by expiring (a later delivery is rejected as expired)."""

    def __init__(
        self,
        index: int,
        spec: Node,
        prereqs: int,
        dependents: tuple[int, ...],
    ) -> None:
        self.index = index
        self.spec = spec
        self.status = _PENDING
        self.attempt = 0
        """Attempts made in the current activation (one-based once started)."""
        self.total_attempts = 0
        self.attempt_id: str | None = None
        self.attempt_deadline: int | None = None
        self.last_outcome: NodeOutcome | None = None
        self.prereqs = prereqs
        self.done_prereqs = 0
        self.succeeded_prereqs = 0
        self.dependents = dependents
        self.detail: NodeDetail | None = None
        """The node's rarely set fields, ``None`` while every one has its default."""

    @property
    def node_id(self) -> str:
        """The node's id."""
        return self.spec.id

    def clone(self) -> NodeState:
        """A shallow copy (specs and dependents are immutable and shared; the detail is copied)."""
        return _clone_node(self)

    def __repr__(self) -> str:
        return f"<NodeState {self.spec.id} {self.status.value} attempt={self.attempt}>"


def _compile_copy(
    cls: type[_T], slots: tuple[str, ...], skip: str = "", tail: tuple[str, ...] = ()
) -> Callable[[_T], _T]:
    """A shallow copy of a slotted ``cls`` as straight-line attribute copies (a loop cost 3x more)."""
    lines = ["def copy_of(obj):", "    copy = new(cls)"]
    lines += [f"    copy.{name} = obj.{name}" for name in slots if name != skip]
    lines += [f"    {line}" for line in tail]
    lines.append("    return copy")
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    exec("\n".join(lines), namespace)  # source built above from the slot names only
    copy_of: Callable[[_T], _T] = namespace["copy_of"]
    return copy_of


def compile_assign(fields: tuple[str, ...]) -> Callable[[Any, Any], None]:
    """``assign(target, source)``: each of ``fields`` set on ``target`` to ``source``'s, straight-line.

    For the reducer's draft (:mod:`mayfly.reducer._draft`), which hands a
    run's scalars and its changed nodes' fields back and forth, keeping the
    objects' identity; straight-line for the reason ``_compile_copy`` is.
    """
    lines = ["def assign(target, source):"]
    lines += [f"    target.{name} = source.{name}" for name in fields]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # source built above from the field names only
    assign: Callable[[Any, Any], None] = namespace["assign"]
    return assign


_copy_detail = _compile_copy(NodeDetail, NodeDetail.__slots__)
# The detail is mutable: a clone (a decision's draft) must never write into its base's.
_clone_node = _compile_copy(
    NodeState,
    NodeState.__slots__,
    skip="detail",
    tail=("detail = obj.detail", "copy.detail = None if detail is None else detail.copy()"),
)


# gc=False (here and on NodeRecord): frozen values that cannot form reference cycles; a run holds one per
# attempt, and restoring 100k of them as GC-tracked objects made every collection walk them.
class AttemptRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """An attempt identity consumed by the run, and its committed outcome once it has one."""

    attempt_id: str
    node_id: str
    outcome: NodeOutcome | None = None
    child_run_id: str | None = None


class NodeRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """Serialized :class:`NodeState` (dependency counters are rebuilt, not stored)."""

    node_id: str
    status: NodeStatus
    attempt: int = 0
    total_attempts: int = 0
    attempt_id: str | None = None
    attempt_deadline: int | None = None
    retry_deadline: int | None = None
    last_outcome: NodeOutcome | None = None
    failure: FailureCause | None = None
    outcome_seq: int = 0
    child_run_id: str | None = None
    wait: SignalWait | None = None
    signal: AcceptedSignal | None = None
    paused_deadline: int | None = None
    wait_expired: bool = False


class RunStateRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Serialized :class:`RunState`, the body of snapshots and state golden fixtures."""

    schema_version: int
    run_id: str
    spec: WorkflowSpec
    spec_hash: str
    status: RunStatus
    sequence: int
    now: int
    attempts_used: int
    transitions_used: int
    nodes: tuple[NodeRecord, ...]
    attempts: tuple[AttemptRecord, ...]
    input: JsonValue = None
    ready: tuple[str, ...] = ()
    last_outcome: LastOutcome | None = None
    exhausted: BudgetExhausted | None = None
    cancellation: CancellationRequested | None = None
    edges_fired: tuple[int, ...] = ()
    parent: ParentLink | None = None
    signals: tuple[ConsumedSignal, ...] = ()
    epoch_ms: int | None = None
    queue: str = "default"
    priority: int = 0
    dedup_id: str | None = None


class RunState:
    """Everything known about one run, derived by reducing its history.

    Read it freely; change it only through :func:`mayfly.reducer.reduce`.
    """

    __slots__ = (
        "_active",
        "_attempts",
        "_children",
        "_edges_fired",
        "_parked",
        "_ready",
        "_retries",
        "_signals",
        "_waiting",
        "attempts_used",
        "cancellation",
        "dedup_id",
        "epoch_ms",
        "exhausted",
        "index",
        "input",
        "last_outcome",
        "n_blocked",
        "n_cancelled",
        "n_failed",
        "n_idle",
        "nodes",
        "now",
        "open_nodes",
        "parent",
        "priority",
        "queue",
        "run_id",
        "sequence",
        "spec",
        "spec_hash",
        "status",
        "transitions_used",
    )

    def __init__(
        self,
        run_id: str,
        spec: WorkflowSpec,
        spec_hash: str,
        input: JsonValue,
        parent: ParentLink | None = None,
        *,
        epoch_ms: int | None = None,
        queue: str = "default",
        priority: int = 0,
        dedup_id: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.parent = parent
        self.queue = queue
        """The queue workers claim this run from, from ``RunCreated``."""
        self.priority = priority
        """The run's claim priority on its queue (higher first), from ``RunCreated``."""
        self.dedup_id = dedup_id
        """The run's deduplication id on its queue, from ``RunCreated`` (``None``: none)."""
        self.epoch_ms = epoch_ms
        """Wall-clock Unix milliseconds at virtual time 0, from ``RunCreated`` (``None`` for older runs)."""
        self.spec = spec
        self.spec_hash = spec_hash
        self.input = input
        self.status = _RUN_RUNNING
        self.sequence = 0
        self.now = 0
        self.attempts_used = 0
        self.transitions_used = 0
        self.last_outcome: LastOutcome | None = None
        self.exhausted: BudgetExhausted | None = None
        self.cancellation: CancellationRequested | None = None
        self.n_failed = 0
        self.n_blocked = 0
        self.n_cancelled = 0
        nodes = spec.nodes
        # One int object per position, shared by every index below: positions past 256 are not
        # cached by Python, and an int per index entry, node and dependent cost 64 B a node.
        positions = list(range(len(nodes)))
        index = dict(zip([node.id for node in nodes], positions, strict=True))
        # Only the nodes that have dependents or edges get lists: most have neither, and a list per
        # node made building a 100k-node state allocate (and the collector walk) 300k of them.
        dependents: dict[int, list[int]] = {}
        for i, node in zip(positions, nodes, strict=True):
            for prereq in node.depends_on:
                prereq_at = index[prereq]
                listed = dependents.get(prereq_at)
                if listed is None:
                    dependents[prereq_at] = [i]
                else:
                    listed.append(i)
        out_edges: dict[int, list[int]] = {}
        edge_targets: dict[int, list[int]] = {}
        in_edges: dict[int, int] = {}
        for k, edge in enumerate(spec.edges):
            source, target = index[edge.source], index[edge.target]
            out_edges.setdefault(source, []).append(k)
            edge_targets.setdefault(source, []).append(target)
            in_edges[target] = in_edges.get(target, 0) + 1
        self.index = index
        # Equal dependent tuples are shared (every branch of a fan-out has the same one).
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}
        dependent_tuples = {
            i: shared.setdefault(listed, listed)
            for i, listed in zip(dependents, map(tuple, dependents.values()), strict=True)
        }
        with collector_paused():
            self.nodes = [
                NodeState(i, node, len(node.depends_on), dependent_tuples.get(i, ()))
                for i, node in zip(positions, nodes, strict=True)
            ]
        for i in {*out_edges, *in_edges}:
            detail = self.nodes[i].detail = NodeDetail()
            detail.out_edges = tuple(out_edges.get(i, ()))
            detail.edge_targets = tuple(edge_targets.get(i, ()))
            detail.in_edges = in_edges.get(i, 0)
        self.open_nodes = len(self.nodes)
        self.n_idle = len(self.nodes)
        self._attempts: dict[str, AttemptRecord] = {}
        self._active: dict[str, int] = {}
        self._ready: dict[int, None] = {}
        self._retries: dict[int, int] = {}
        # Every node starts Pending: parked exactly when nothing but an edge can start it (is_parked).
        self._parked: dict[int, None] = {
            i: None for i, node in zip(positions, nodes, strict=True) if not node.depends_on
        }
        self._edges_fired = [0] * len(spec.edges)
        self._children: dict[str, str] = {}
        self._signals: dict[str, ConsumedSignal] = {}
        self._waiting: dict[int, None] = {}

    # -- reads -------------------------------------------------------------

    def node(self, index: int) -> NodeState:
        """The node at ``index`` (specification order)."""
        return self.nodes[index]

    def node_by_id(self, node_id: str) -> NodeState | None:
        """The node called ``node_id``, or ``None``."""
        i = self.index.get(node_id)
        return None if i is None else self.nodes[i]

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        """The record of a consumed attempt identity, or ``None`` if never used in this run."""
        return self._attempts.get(attempt_id)

    def active_attempts(self) -> Iterator[tuple[str, int]]:
        """``(attempt_id, node index)`` of every started attempt without an outcome, in start order."""
        return iter(list(self._active.items()))

    def pending_retries(self) -> Iterator[tuple[int, int]]:
        """``(node index, deadline)`` of every scheduled, unreleased retry."""
        return iter(list(self._retries.items()))

    def ready_nodes(self) -> list[str]:
        """Ids of the nodes that are Ready, in specification order."""
        return [self.nodes[i].spec.id for i in sorted(self._ready)]

    @property
    def has_ready(self) -> bool:
        """Whether any node is Ready (O(1))."""
        return bool(self._ready)

    @property
    def ready_count(self) -> int:
        """How many nodes are Ready (O(1))."""
        return len(self._ready)

    @property
    def active_count(self) -> int:
        """How many started attempts have no outcome yet, waiting ones included (O(1))."""
        return len(self._active)

    @property
    def waiting_count(self) -> int:
        """How many nodes are parked on an open durable wait (O(1))."""
        return len(self._waiting)

    def parked_nodes(self) -> list[int]:
        """Indexes of the parked nodes (see :func:`is_parked`), in specification order."""
        return sorted(self._parked)

    def edge_fired(self, edge: int) -> int:
        """The source-outcome sequence of edge ``edge``'s latest activation (0 if it never fired)."""
        return self._edges_fired[edge]

    def child_attempt(self, child_run_id: str) -> str | None:
        """The attempt that started child run ``child_run_id``, or ``None`` if this run never did."""
        return self._children.get(child_run_id)

    def consumed_signal(self, signal_id: str) -> ConsumedSignal | None:
        """How signal ``signal_id`` was consumed, or ``None`` if this run never saw it."""
        return self._signals.get(signal_id)

    def waiting_nodes(self) -> list[NodeState]:
        """Nodes parked on an open durable wait, in specification order."""
        return [self.nodes[i] for i in sorted(self._waiting)]

    @property
    def depth(self) -> int:
        """Child nesting depth: 0 for a root run."""
        return 0 if self.parent is None else self.parent.depth

    @property
    def attempt_count(self) -> int:
        """How many attempt identities this run has consumed."""
        return len(self._attempts)

    # -- mutations, used only by the reducer --------------------------------

    def node_mut(self, index: int) -> NodeState:
        """The node at ``index``, for the reducer to change in place."""
        return self.nodes[index]

    def record_attempt(self, record: AttemptRecord, index: int) -> None:
        """Consume an attempt identity and mark it active on node ``index``."""
        self._attempts[record.attempt_id] = record
        self._active[record.attempt_id] = index
        if record.child_run_id is not None:
            self._children[record.child_run_id] = record.attempt_id

    def close_attempt(self, attempt_id: str, outcome: NodeOutcome) -> None:
        """Commit the one outcome of an active attempt."""
        record = self._attempts[attempt_id]
        self._attempts[attempt_id] = msgspec.structs.replace(record, outcome=outcome)
        del self._active[attempt_id]

    def consume_signal(self, record: ConsumedSignal) -> None:
        """Consume a signal id, once and for all."""
        self._signals[record.signal_id] = record

    def set_parked(self, index: int, parked: bool) -> None:
        """Add ``index`` to, or remove it from, the parked index."""
        if parked:
            self._parked[index] = None
        else:
            self._parked.pop(index, None)

    def set_edge_fired(self, edge: int, source_sequence: int) -> None:
        """Record that edge ``edge`` fired for the source outcome at ``source_sequence``."""
        self._edges_fired[edge] = source_sequence

    def set_ready(self, index: int, ready: bool) -> None:
        """Add ``index`` to, or remove it from, the ready index."""
        if ready:
            self._ready[index] = None
        else:
            self._ready.pop(index, None)

    def set_waiting(self, index: int, waiting: bool) -> None:
        """Add ``index`` to, or remove it from, the waiting index."""
        if waiting:
            self._waiting[index] = None
        else:
            self._waiting.pop(index, None)

    def set_retry(self, index: int, deadline: int | None) -> None:
        """Record (or clear, with ``None``) the scheduled retry deadline of node ``index``."""
        if deadline is None:
            self._retries.pop(index, None)
        else:
            self._retries[index] = deadline

    # -- serialization -----------------------------------------------------

    def to_record(self) -> RunStateRecord:
        """The immutable, serializable form of this state."""
        return RunStateRecord(
            schema_version=STATE_SCHEMA_VERSION,
            run_id=self.run_id,
            spec=self.spec,
            spec_hash=self.spec_hash,
            status=self.status,
            sequence=self.sequence,
            now=self.now,
            attempts_used=self.attempts_used,
            transitions_used=self.transitions_used,
            nodes=tuple(
                NodeRecord(
                    node_id=n.spec.id,
                    status=n.status,
                    attempt=n.attempt,
                    total_attempts=n.total_attempts,
                    attempt_id=n.attempt_id,
                    attempt_deadline=n.attempt_deadline,
                    retry_deadline=n.retry_deadline,
                    last_outcome=n.last_outcome,
                    failure=n.failure,
                    outcome_seq=n.outcome_seq,
                    child_run_id=n.child_run_id,
                    wait=n.wait,
                    signal=n.signal,
                    paused_deadline=n.paused_deadline,
                    wait_expired=n.wait_expired,
                )
                for n in self.nodes
            ),
            attempts=tuple(self._attempts.values()),
            input=self.input,
            ready=tuple(self.ready_nodes()),
            last_outcome=self.last_outcome,
            exhausted=self.exhausted,
            cancellation=self.cancellation,
            edges_fired=tuple(self._edges_fired) if any(self._edges_fired) else (),
            parent=self.parent,
            signals=tuple(self._signals.values()),
            epoch_ms=self.epoch_ms,
            queue=self.queue,
            priority=self.priority,
            dedup_id=self.dedup_id,
        )

    @classmethod
    def from_record(cls, record: RunStateRecord) -> RunState:
        """Rebuild a state (with its indexes and counters) from its serialized form."""
        state = cls(
            record.run_id,
            record.spec,
            record.spec_hash,
            record.input,
            record.parent,
            epoch_ms=record.epoch_ms,
            queue=record.queue,
            priority=record.priority,
            dedup_id=record.dedup_id,
        )
        if len(record.nodes) != len(state.nodes):
            raise ValueError("state record does not match its specification's nodes")
        state.status = record.status
        state.sequence = record.sequence
        state.now = record.now
        state.attempts_used = record.attempts_used
        state.transitions_used = record.transitions_used
        state.last_outcome = record.last_outcome
        state.exhausted = record.exhausted
        state.cancellation = record.cancellation
        for node, saved in zip(state.nodes, record.nodes, strict=True):
            if saved.node_id != node.spec.id:
                raise ValueError(f"state record node {saved.node_id!r} is not {node.spec.id!r}")
            node.status = saved.status
            node.attempt = saved.attempt
            node.total_attempts = saved.total_attempts
            node.attempt_id = saved.attempt_id
            node.attempt_deadline = saved.attempt_deadline
            node.last_outcome = saved.last_outcome
            # The rare fields (a NodeDetail's) hold their defaults on a new node: only the others
            # are set, so most nodes never pay for the detail's attribute calls.
            if saved.retry_deadline is not None:
                node.retry_deadline = saved.retry_deadline
            if saved.failure is not None:
                node.failure = saved.failure
            if saved.outcome_seq:
                node.outcome_seq = saved.outcome_seq
            if saved.child_run_id is not None:
                node.child_run_id = saved.child_run_id
            if saved.wait is not None:
                node.wait = saved.wait
            if saved.signal is not None:
                node.signal = saved.signal
            if saved.paused_deadline is not None:
                node.paused_deadline = saved.paused_deadline
            if saved.wait_expired:
                node.wait_expired = saved.wait_expired
        if record.edges_fired:
            if len(record.edges_fired) != len(state._edges_fired):
                raise ValueError("state record edge activations do not match its specification's edges")
            state._edges_fired = list(record.edges_fired)
        for consumed in record.signals:
            state._signals[consumed.signal_id] = consumed
        for attempt in record.attempts:
            state._attempts[attempt.attempt_id] = attempt
            if attempt.child_run_id is not None:
                state._children[attempt.child_run_id] = attempt.attempt_id
            if attempt.outcome is None:
                # Attempts are stored in start order; active attempts (cancellation targets)
                # must keep that order, not specification order, or a restored state decides differently.
                i = state.index.get(attempt.node_id)
                if i is None or state.nodes[i].attempt_id != attempt.attempt_id:
                    raise ValueError(f"state record attempt {attempt.attempt_id} is not active on its node")
                state._active[attempt.attempt_id] = i
        state._parked = {}
        state.n_idle = 0
        for node in state.nodes:
            if node.status.is_idle:
                state.n_idle += 1
            if is_parked(node, node.status):
                state._parked[node.index] = None
            if node.attempt_id is not None and node.attempt_id not in state._active:
                raise ValueError(f"state record node {node.node_id!r} has no open attempt {node.attempt_id}")
            if node.retry_deadline is not None:
                state._retries[node.index] = node.retry_deadline
            if node.status is _READY:
                state._ready[node.index] = None
            if node.status is _WAITING:
                state._waiting[node.index] = None
            if node.status.is_terminal:
                state.open_nodes -= 1
                count_terminal(state, node)
        return state


class _TerminalCounts(Protocol):
    n_failed: int
    n_blocked: int
    n_cancelled: int

    def node_mut(self, index: int) -> NodeState: ...


def is_parked(node: NodeState, status: NodeStatus) -> bool:
    """Whether ``node`` in ``status`` waits for a conditional edge that may never fire.

    That is a node in ChangesRequested awaiting its correction, or a Pending
    node without ``depends_on`` (only an edge can start it). Nodes with
    ``depends_on`` are not parked: dependency propagation always decides them.
    """
    return status is _CHANGES_REQUESTED or (status is _PENDING and not node.spec.depends_on)


def count_terminal(run: _TerminalCounts, node: NodeState) -> None:
    """Update run totals and the dependents' counters for ``node`` entering its terminal status.

    Dependents keep counters instead of rescanning their prerequisites, so a
    release decision costs O(1) per edge however large the graph grows. Edge
    targets count, in ``closed_in``, the incoming edges that can never fire
    again (their source finished and nothing can re-activate it).
    """
    status = node.status
    if status is _FAILED:
        run.n_failed += 1
    elif status is _BLOCKED:
        run.n_blocked += 1
    elif status is _CANCELLED:
        run.n_cancelled += 1
    for d in node.dependents:
        dep = run.node_mut(d)
        dep.done_prereqs += 1
        if status is _SUCCEEDED:
            dep.succeeded_prereqs += 1
        elif status is _BLOCKED:
            dep.blocked_prereqs += 1
        elif status is _CANCELLED:
            dep.cancelled_prereqs += 1
    detail = node.detail  # None: no edges (read directly: most nodes have none)
    if detail is not None and not detail.in_edges:
        # No edge can re-activate this node, so its edges can never fire again.
        for t in detail.edge_targets:
            run.node_mut(t).closed_in += 1


def uncount_terminal(run: _TerminalCounts, node: NodeState) -> None:
    """Exactly undo :func:`count_terminal` for ``node`` leaving its terminal status (re-activation).

    Call it while ``node.status`` still holds the status being left.
    """
    status = node.status
    if status is _FAILED:
        run.n_failed -= 1
    elif status is _BLOCKED:
        run.n_blocked -= 1
    elif status is _CANCELLED:
        run.n_cancelled -= 1
    for d in node.dependents:
        dep = run.node_mut(d)
        dep.done_prereqs -= 1
        if status is _SUCCEEDED:
            dep.succeeded_prereqs -= 1
        elif status is _BLOCKED:
            dep.blocked_prereqs -= 1
        elif status is _CANCELLED:
            dep.cancelled_prereqs -= 1
    detail = node.detail
    if detail is not None and not detail.in_edges:
        for t in detail.edge_targets:
            run.node_mut(t).closed_in -= 1
