"""The draft a decision is made on: a copy-on-write overlay of a :class:`RunState`.

``decide`` applies the events it is about to propose to a :class:`Draft`
(:meth:`Draft.emit`), through the same :func:`~mayfly.reducer._apply.apply_event`
that ``reduce`` applies to the real state, so it sees their consequences — a
node released, a run completed — without mutating anything and without a
second copy of the rules. A draft costs O(what it changes): nodes are
cloned on first write and every index is an overlay over the base's.

Once the batch is appended, :meth:`Draft.settle` hands the draft's results
to the base state, so the engine applies the rules to a batch once, not once
to decide and again to reduce; replay (:func:`mayfly.reducer.reduce`) stays
the definition, and properties hold the two equal field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from mayfly.model.events import BudgetExhausted, CancellationRequested, Event, LastOutcome
from mayfly.model.outcomes import NodeOutcome
from mayfly.model.signals import ConsumedSignal
from mayfly.model.state import AttemptRecord, NodeState, NodeStatus, RunState, RunStatus, compile_assign
from mayfly.reducer._apply import apply_event

__all__ = ["Draft"]

_WAITING = NodeStatus.WAITING
# The base's own index updates, replayed by Draft.settle in the order the draft made them.
_RECORD_ATTEMPT = RunState.record_attempt
_CLOSE_ATTEMPT = RunState.close_attempt
_SET_READY = RunState.set_ready
_SET_WAITING = RunState.set_waiting
_SET_RETRY = RunState.set_retry
_SET_PARKED = RunState.set_parked
_SET_EDGE_FIRED = RunState.set_edge_fired
_CONSUME_SIGNAL = RunState.consume_signal


# A changed node's fields, copied into the base's node; the run's scalars a decision reads and
# changes, copied from the base into a draft and back (a getattr/setattr loop cost 2x).
_assign_node = compile_assign(NodeState.__slots__)
_SCALARS = (
    "status",
    "sequence",
    "now",
    "attempts_used",
    "transitions_used",
    "open_nodes",
    "n_failed",
    "n_blocked",
    "n_cancelled",
    "n_idle",
    "last_outcome",
    "exhausted",
    "cancellation",
)
_assign_scalars = compile_assign(_SCALARS)


class Draft:
    """A copy-on-write view of a :class:`RunState` that collects proposed events.

    Nodes are cloned on first write; attempt, active and retry indexes are
    overlaid. The base state is never touched, so a rejected or unappended
    decision leaves it exactly as it was.
    """

    status: RunStatus
    sequence: int
    now: int
    attempts_used: int
    transitions_used: int
    open_nodes: int
    n_failed: int
    n_blocked: int
    n_cancelled: int
    n_idle: int
    last_outcome: LastOutcome | None
    exhausted: BudgetExhausted | None
    cancellation: CancellationRequested | None

    def __init__(self, base: RunState) -> None:
        self.base = base
        self.run_id = base.run_id
        self.spec = base.spec
        self.parent = base.parent
        self.index = base.index
        _assign_scalars(self, base)
        self.events: list[Event] = []
        self._nodes: dict[int, NodeState] = {}
        self._attempts: dict[str, AttemptRecord] = {}
        self._active_added: dict[str, int] = {}
        self._active_closed: set[str] = set()
        self._retries: dict[int, int | None] = {}
        self._parked: dict[int, bool] = {}
        self._edges_fired: dict[int, int] = {}
        self._children: dict[str, str] = {}
        self._signals: dict[str, ConsumedSignal] = {}
        # What the index entry of the run after the batch reads (mayfly.runindex.index_entry).
        self._ready_delta = 0
        self._waiting_delta = 0
        self._new_attempts = 0
        # Every index update, in order, for settle to make on the base: (RunState method, its arguments).
        self._log: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def emit(self, event: Event) -> None:
        """Propose ``event``: apply it to the draft and queue it for the batch."""
        apply_event(self, event, self.sequence + 1)
        self.events.append(event)

    def node(self, index: int) -> NodeState:
        """The node as the draft sees it."""
        node = self._nodes.get(index)
        return node if node is not None else self.base.nodes[index]

    def changed_nodes(self) -> Iterator[tuple[int, NodeState]]:
        """The nodes the draft changed, with their indexes."""
        return iter(self._nodes.items())

    def node_mut(self, index: int) -> NodeState:
        """A private copy of the node that the draft may change."""
        node = self._nodes.get(index)
        if node is None:
            node = self._nodes[index] = self.base.nodes[index].clone()
        return node

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        """The attempt record as the draft sees it."""
        record = self._attempts.get(attempt_id)
        return record if record is not None else self.base.attempt(attempt_id)

    def record_attempt(self, record: AttemptRecord, index: int) -> None:
        """Consume an attempt identity in the draft."""
        self._new_attempts += 1  # the reducer refuses an identity consumed before
        self._log.append((_RECORD_ATTEMPT, (record, index)))
        self._attempts[record.attempt_id] = record
        self._active_added[record.attempt_id] = index
        if record.child_run_id is not None:
            self._children[record.child_run_id] = record.attempt_id

    def close_attempt(self, attempt_id: str, outcome: NodeOutcome) -> None:
        """Commit an attempt outcome in the draft."""
        record = self.attempt(attempt_id)
        assert record is not None
        self._log.append((_CLOSE_ATTEMPT, (attempt_id, outcome)))
        self._attempts[attempt_id] = msgspec.structs.replace(record, outcome=outcome)
        if self._active_added.pop(attempt_id, None) is None:
            self._active_closed.add(attempt_id)

    def set_ready(self, index: int, ready: bool) -> None:
        """Count a node entering or leaving Ready (decisions never consult the ready index itself)."""
        self._ready_delta += 1 if ready else -1
        self._log.append((_SET_READY, (index, ready)))

    def set_waiting(self, index: int, waiting: bool) -> None:
        """Count a node entering or leaving Waiting."""
        self._waiting_delta += 1 if waiting else -1
        self._log.append((_SET_WAITING, (index, waiting)))

    # -- the run after the batch, as mayfly.runindex.index_entry reads it -----------------

    @property
    def queue(self) -> str:
        """The run's queue (fixed at creation)."""
        return self.base.queue

    @property
    def priority(self) -> int:
        """The run's claim priority (fixed at creation)."""
        return self.base.priority

    @property
    def dedup_id(self) -> str | None:
        """The run's deduplication id (fixed at creation)."""
        return self.base.dedup_id

    @property
    def epoch_ms(self) -> int | None:
        """The run's epoch (fixed at creation)."""
        return self.base.epoch_ms

    @property
    def attempt_count(self) -> int:
        """Attempt identities consumed, the draft's included."""
        return self.base.attempt_count + self._new_attempts

    @property
    def has_ready(self) -> bool:
        """Whether any node is Ready after the draft."""
        return self.base.ready_count + self._ready_delta > 0

    @property
    def active_count(self) -> int:
        """Started attempts without an outcome after the draft."""
        return self.base.active_count - len(self._active_closed) + len(self._active_added)

    @property
    def waiting_count(self) -> int:
        """Nodes parked on an open durable wait after the draft."""
        return self.base.waiting_count + self._waiting_delta

    def waiting_nodes(self) -> list[NodeState]:
        """Nodes parked on an open durable wait after the draft, in specification order."""
        nodes = {node.index: node for node in self.base.waiting_nodes()}
        nodes.update(self._nodes)
        return [node for _, node in sorted(nodes.items()) if node.status is _WAITING]

    def set_retry(self, index: int, deadline: int | None) -> None:
        """Record a retry change in the draft."""
        self._retries[index] = deadline
        self._log.append((_SET_RETRY, (index, deadline)))

    def active_attempts(self) -> Iterator[tuple[str, int]]:
        """Active attempts as the draft sees them, in start order."""
        for attempt_id, index in self.base.active_attempts():
            if attempt_id not in self._active_closed:
                yield attempt_id, index
        yield from list(self._active_added.items())

    def pending_retries(self) -> Iterator[tuple[int, int]]:
        """Scheduled retries as the draft sees them."""
        for index, deadline in self.base.pending_retries():
            if index not in self._retries:
                yield index, deadline
        for index, changed in list(self._retries.items()):
            if changed is not None:
                yield index, changed

    def set_parked(self, index: int, parked: bool) -> None:
        """Record a parked-index change in the draft."""
        self._parked[index] = parked
        self._log.append((_SET_PARKED, (index, parked)))

    def parked_nodes(self) -> list[int]:
        """Parked nodes as the draft sees them, in specification order."""
        parked = {i for i in self.base.parked_nodes() if self._parked.get(i, True)}
        parked.update(i for i, now in self._parked.items() if now)
        return sorted(parked)

    def edge_fired(self, edge: int) -> int:
        """The latest activation of ``edge`` as the draft sees it."""
        fired = self._edges_fired.get(edge)
        return fired if fired is not None else self.base.edge_fired(edge)

    def set_edge_fired(self, edge: int, source_sequence: int) -> None:
        """Record an edge activation in the draft."""
        self._edges_fired[edge] = source_sequence
        self._log.append((_SET_EDGE_FIRED, (edge, source_sequence)))

    def child_attempt(self, child_run_id: str) -> str | None:
        """The attempt that started ``child_run_id``, as the draft sees it."""
        attempt = self._children.get(child_run_id)
        return attempt if attempt is not None else self.base.child_attempt(child_run_id)

    def consumed_signal(self, signal_id: str) -> ConsumedSignal | None:
        """How ``signal_id`` was consumed, as the draft sees it."""
        record = self._signals.get(signal_id)
        return record if record is not None else self.base.consumed_signal(signal_id)

    def consume_signal(self, record: ConsumedSignal) -> None:
        """Consume a signal id in the draft."""
        self._signals[record.signal_id] = record
        self._log.append((_CONSUME_SIGNAL, (record,)))

    # -- adopting the draft once its batch is appended ------------------------------------

    def settle(self) -> RunState:
        """Make the base the state that reducing this draft's events would make it, and return it.

        Call it once the draft's batch is acknowledged, instead of reducing the
        batch again: the rules already ran on the draft (:meth:`emit`), so the
        base takes the draft's results, each changed node's fields copied into
        the base's node (which keeps its identity), every index update made in
        the draft's order, then the run's scalars. The draft is spent after it.
        """
        base = self.base
        nodes = base.nodes
        for index, node in self._nodes.items():
            _assign_node(nodes[index], node)
        for update, arguments in self._log:
            update(base, *arguments)
        _assign_scalars(base, self)
        self._nodes = {}
        self._log = []
        return base
