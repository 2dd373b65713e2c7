"""PAL: payload-free facts of acknowledged records and recovery operations, joined by a causal key."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import msgspec

from mayfly.journal import JournalRecord
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import (
    ChildStarted,
    EdgeActivated,
    NodeOutcomeCommitted,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
)
from mayfly.model.outcomes import NodeOutcomeKind, RetryableFailure
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import plugin_manager
from mayfly.recovery import RecoveredRun
from mayfly.reducer import Upcaster, decode_event, reduce
from mayfly.telemetry.metrics import RecoveryMode

__all__ = ["PAL_SCHEMA_VERSION", "PalFact", "PalProjector", "causal_key", "project_pal", "recovery_fact"]

PAL_SCHEMA_VERSION: Final = 1
"""Version of :class:`PalFact` and its JSON form."""


# -- the causal key ---------------------------------------------------------------------


def causal_key(run_id: str, node_id: str | None = None, attempt_id: str | None = None) -> str:
    """The deterministic key joining run, node and attempt scope across handler spans and PAL.

    ``sha256(run_id + "\\x1f" + node_id + "\\x1f" + attempt_id)`` over UTF-8, a
    missing scope written as the empty string, as the first 32 lowercase hex
    digits. The separator (0x1F) cannot occur in a run, node or attempt id.
    """
    scope = "\x1f".join((run_id, node_id or "", attempt_id or ""))
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:32]


# -- PAL --------------------------------------------------------------------------------


class PalFact(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One payload-free PAL fact: an acknowledged record, or an explicit recovery operation.

    For a record (``kind="record"``): its ``sequence``, ``event_id`` and
    ``event_type``; the node and attempt it concerns, if any; the outcome
    class of an outcome event; the node status before and after
    (``node_from``/``node_to``) and the run status after; ``at`` is the run's
    virtual time after the event. For a recovery (``kind="recovery"``,
    ``event_type="Recovery"``): ``recovery_mode``, with ``sequence`` and
    ``event_id`` of the last record the recovery read. ``causal_key`` is
    :func:`causal_key` of the fact's scope.
    """

    kind: Literal["record", "recovery"]
    causal_key: str
    run_id: str
    sequence: int
    event_id: str
    event_type: str
    at: int
    run_status: RunStatus
    schema_version: int = PAL_SCHEMA_VERSION
    node_id: str | None = None
    attempt_id: str | None = None
    attempt: int | None = None
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    node_from: NodeStatus | None = None
    node_to: NodeStatus | None = None
    recovery_mode: RecoveryMode | None = None


class PalProjector:
    """Projects one run's records to PAL facts, incrementally, in sequence order.

    It keeps a private state, reduced from the records it projects, to report
    status transitions; that state is its own and never written back.
    Start it empty (records from sequence 1) or from a copy of a run's state
    (records from ``state.sequence + 1``). A record out of order, or of
    another run, raises :class:`~mayfly.model.errors.InvalidRecord`.
    ``upcasters`` lift older event versions as the records are decoded; left
    out, they are those of the process's plugin manager
    (:func:`mayfly.plugins.plugin_manager`), and ``{}`` means none.
    """

    def __init__(
        self,
        state: RunState | None = None,
        *,
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        # A copy: reduction mutates in place, and the caller's state must stay untouched.
        self._state = None if state is None else RunState.from_record(state.to_record())
        self._upcasters = plugin_manager().event_upcasters() if upcasters is None else upcasters

    def project(self, records: Iterable[JournalRecord]) -> list[PalFact]:
        """The facts of ``records``, which continue the run where the projector stands."""
        facts: list[PalFact] = []
        for record in records:
            state = self._state
            expected = 1 if state is None else state.sequence + 1
            if record.sequence != expected or (state is not None and record.run_id != state.run_id):
                where = "a new run" if state is None else f"run {state.run_id}"
                raise InvalidRecord(
                    f"PAL projection of {where} expected sequence {expected}, got run {record.run_id} "
                    f"sequence {record.sequence}; project records in order from the projector's state"
                )
            event = decode_event(
                record.event_type, record.schema_version, record.payload, upcasters=self._upcasters
            )
            node_id = getattr(event, "node_id", None)
            if isinstance(event, EdgeActivated):
                node_id = event.target  # the node the edge activates
            node_id = node_id if isinstance(node_id, str) else None
            attempt_id = getattr(event, "attempt_id", None)
            attempt_id = attempt_id if isinstance(attempt_id, str) else None
            before = None
            node_before = None if state is None or node_id is None else state.node_by_id(node_id)
            if node_before is not None:
                before = node_before.status
            attempt: int | None = None
            if isinstance(event, NodeStarted | ChildStarted):
                attempt = event.attempt
            elif isinstance(event, RetryScheduled | RetryReleased):
                attempt = event.next_attempt
            elif node_before is not None and attempt_id is not None and node_before.attempt_id == attempt_id:
                attempt = node_before.attempt
            self._state = after_state = reduce(state, event, record.sequence)
            node_after = None if node_id is None else after_state.node_by_id(node_id)
            outcome = event.outcome if isinstance(event, NodeOutcomeCommitted) else None
            facts.append(
                PalFact(
                    kind="record",
                    causal_key=causal_key(record.run_id, node_id, attempt_id),
                    run_id=record.run_id,
                    sequence=record.sequence,
                    event_id=record.event_id,
                    event_type=record.event_type,
                    at=after_state.now,
                    run_status=after_state.status,
                    node_id=node_id,
                    attempt_id=attempt_id,
                    attempt=attempt,
                    outcome=None if outcome is None else outcome.kind,
                    timeout=isinstance(outcome, RetryableFailure) and outcome.timeout,
                    node_from=before,
                    node_to=None if node_after is None else node_after.status,
                )
            )
        return facts


def project_pal(
    records: Iterable[JournalRecord], *, upcasters: Mapping[tuple[str, int], Upcaster] | None = None
) -> list[PalFact]:
    """The payload-free PAL facts of one run's records, which start at sequence 1."""
    return PalProjector(upcasters=upcasters).project(records)


def recovery_fact(recovered: RecoveredRun, mode: RecoveryMode) -> PalFact:
    """The PAL fact of an explicit recovery operation on ``recovered`` (scope: the run)."""
    state = recovered.state
    last = recovered.last_record
    return PalFact(
        kind="recovery",
        causal_key=causal_key(state.run_id),
        run_id=state.run_id,
        sequence=last.sequence,
        event_id=last.event_id,
        event_type="Recovery",
        at=state.now,
        run_status=state.status,
        recovery_mode=mode,
    )
