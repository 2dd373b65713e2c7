"""A decide/reduce driver for tests: commands in, exact history out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    CreateRun,
    Rejection,
    StartNodes,
)
from mayfly.model.errors import CommandRejected, MayflyError
from mayfly.model.events import Event
from mayfly.model.ids import DeterministicIdSource, IdSource
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcome
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import NodeStatus, RunState
from mayfly.reducer import reduce, replay
from mayfly.reducer._draft import Draft
from mayfly.reducer.decide import decide_draft

__all__ = ["ReducerHarness", "ScriptExhausted"]


class ScriptExhausted(MayflyError):
    """A scripted run needed an outcome for a node whose script had run out."""


class ReducerHarness:
    """Drive one run through the pure reducer, keeping its complete history.

    Every accepted command's events are reduced into :attr:`state` and appended
    to :attr:`history`; a rejected command raises :class:`CommandRejected`
    (or is returned by :meth:`try_execute`) and changes nothing.
    """

    def __init__(self, spec: WorkflowSpec, *, input: JsonValue = None, ids: IdSource | None = None) -> None:
        self.ids: IdSource = ids if ids is not None else DeterministicIdSource()
        self.run_id = self.ids.new_id()
        self.history: list[Event] = []
        self._state: RunState | None = None
        self.execute(CreateRun(run_id=self.run_id, spec=spec, input=input))

    @property
    def state(self) -> RunState:
        """The live state after every accepted command."""
        assert self._state is not None
        return self._state

    def try_execute(self, command: Command) -> list[Event] | Rejection:
        """Decide and, if accepted, apply ``command``; return its events or the rejection.

        The state moves on as the engine's does after an append: it takes the
        results of the draft the events were decided on (the rules ran once,
        there); :meth:`replayed` reduces the history from scratch instead.
        """
        drafted = decide_draft(self._state, command)
        if isinstance(drafted, Rejection):
            return drafted
        if isinstance(drafted, Draft):
            decision = list(drafted.events)
            self._state = drafted.settle()
            self.history.extend(decision)
            return decision
        for event in drafted:
            self._state = reduce(self._state, event, len(self.history) + 1)
            self.history.append(event)
        return drafted

    def execute(self, command: Command) -> list[Event]:
        """Like :meth:`try_execute`, but a rejection raises :class:`CommandRejected`."""
        decision = self.try_execute(command)
        if isinstance(decision, Rejection):
            raise CommandRejected(decision, f"{type(command).__name__} rejected: {decision}")
        return decision

    def start(self, *node_ids: str) -> dict[str, str]:
        """Start one attempt of each ready node (all in one batch); return their attempt ids."""
        starts = tuple(AttemptStart(node_id, self.ids.new_id()) for node_id in node_ids)
        self.execute(StartNodes(starts))
        return {s.node_id: s.attempt_id for s in starts}

    def complete(self, node_id: str, outcome: NodeOutcome, attempt_id: str | None = None) -> list[Event]:
        """Report ``outcome`` for the node's active attempt (or the given attempt id)."""
        if attempt_id is None:
            node = self.state.node_by_id(node_id)
            if node is None or node.attempt_id is None:
                raise ValueError(f"node {node_id!r} has no active attempt")
            attempt_id = node.attempt_id
        return self.execute(CompleteAttempt(node_id, attempt_id, outcome))

    def advance(self, to: int) -> list[Event]:
        """Advance virtual time to ``to`` ms."""
        return self.execute(AdvanceTime(to))

    def cancel(self, reason: str = "test", requester: str = "test") -> list[Event]:
        """Cancel the run."""
        return self.execute(CancelRun(requester, reason))

    def run_script(self, script: Mapping[str, Sequence[NodeOutcome]]) -> RunState:
        """Drive the run to its end: each attempt of a node takes the node's next scripted outcome.

        Ready nodes are started together in specification order; when none is
        ready, virtual time jumps to the earliest scheduled retry.
        """
        queues: dict[str, list[NodeOutcome]] = {k: list(v) for k, v in script.items()}
        while not self.state.status.is_terminal:
            ready = self.state.ready_nodes()
            if ready:
                started = self.start(*ready)
                for node_id in started:
                    # A start batch can exhaust a budget and end the run; later nodes then are not running.
                    node = self.state.node_by_id(node_id)
                    if node is None or node.status is not NodeStatus.RUNNING:
                        continue
                    queue = queues.get(node_id)
                    if not queue:
                        raise ScriptExhausted(f"no scripted outcome left for node {node_id!r}")
                    self.complete(node_id, queue.pop(0))
                continue
            retries = sorted(deadline for _, deadline in self.state.pending_retries())
            if not retries:
                raise RuntimeError("the run is stuck: nothing ready, running or scheduled")
            self.advance(max(retries[0], self.state.now))
        return self.state

    def replayed(self) -> RunState:
        """A fresh state reduced from the recorded history (for replay = live checks)."""
        return replay(self.history)

    def types(self) -> list[str]:
        """The event type names of the history, in order."""
        return [type(event).__name__ for event in self.history]
