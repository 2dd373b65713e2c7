"""The drive context: what every run a runtime drives shares, fixed before the first one starts.

A :class:`DriveContext` holds the journal and lease store, the handlers, the
id source, the owner and its lease TTL, the snapshot policy, the observer and
the upcasters history is read with. None of it changes while runs are
driven, so it is immutable, and one context serves any number of runs driven
at once on a hub: a runtime's root runs and their child runs, or a worker's
claimed runs. What changes while one run is driven (its state, lease, tasks
and requests) lives in that run's :class:`~mayfly.runtime._driver.RunDriver`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import final

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.events import Event
from mayfly.model.ids import IdSource
from mayfly.model.state import RunState
from mayfly.recovery import RecoveryEffect
from mayfly.reducer import Upcaster
from mayfly.runtime.registry import HandlerRegistry

__all__ = ["DriveContext", "Observer", "notify_recovery"]

Observer = Callable[[RunState, tuple[Event, ...]], None]
"""Called after every commit with the new state and the committed events (progress, timelines)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DriveContext:
    """The stores, handlers, identity and policies shared by every run driven with it."""

    journal: WorkflowJournal
    registry: HandlerRegistry
    ids: IdSource
    lease_ttl_ms: int
    """The TTL every lease is taken and renewed with; drivers renew every third of it."""
    snapshot_every: int
    """A snapshot is written after this many committed records, and when a run ends."""
    leases: RecoveryLeaseStore | None = None
    """Where child runs are leased; without a store, children run unleased like their parent."""
    owner: str = "mayfly"
    """Who holds the leases of the runs driven with this context."""
    observer: Observer | None = None
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None
    """What lifts older event versions whenever a driver reads history (resumed or cancelled runs)."""

    def observe(self, state: RunState, events: tuple[Event, ...]) -> None:
        """Tell the observer, if there is one, about a commit."""
        if self.observer is not None:
            self.observer(state, events)


def notify_recovery(observer: Observer | None, state: RunState, effects: tuple[RecoveryEffect, ...]) -> None:
    """Tell an observer that watches recoveries about a resumed run, before its recovery plan runs.

    Such an observer has an ``on_recovery(state, effects)`` method, called as
    ``WorkflowRuntime.resume``'s ``on_recovery`` is. Once per resumed run, never
    per node; an observer without the method (or none) costs one lookup.
    """
    on_recovery = getattr(observer, "on_recovery", None)
    if callable(on_recovery):
        on_recovery(state, effects)
