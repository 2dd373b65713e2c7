"""The inspection's value types: a schema-versioned, payload-free view of one run and its parts."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from mayfly.model.events import FailureCause
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import NodeStatus

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "INSPECTION_SCHEMA_VERSION",
    "AttemptSummary",
    "BlockingDiagnostic",
    "BudgetExhaustion",
    "BudgetUsage",
    "CancellationSummary",
    "DiagnosticHistory",
    "NodeSummary",
    "RunInspection",
]

INSPECTION_SCHEMA_VERSION: Final = 2
"""Version of :class:`RunInspection` and its JSON form.

2: ``status`` is the run's status word (a run status value, or ``waiting``), no longer a
:class:`~mayfly.model.state.RunStatus`.
"""

DEFAULT_HISTORY_LIMIT: Final = 200
"""How many diagnostic history lines an inspection keeps by default (the most recent)."""

_MAX_LISTED = 5  # prerequisites or edge sources named in one blocking diagnostic


class _Frozen(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class BudgetExhaustion(_Frozen, frozen=True):
    """The budget that ran out: which, its limit, the usage observed and the last outcome before it."""

    kind: str
    limit: int
    observed: int
    node_id: str | None = None
    last_outcome_node: str | None = None
    last_outcome_kind: NodeOutcomeKind | None = None


class BudgetUsage(_Frozen, frozen=True):
    """Run budget usage against the specification's limits (``elapsed_ms`` is the run's virtual time)."""

    attempts_used: int
    attempts_limit: int
    transitions_used: int
    transitions_limit: int
    elapsed_ms: int
    elapsed_limit_ms: int | None = None
    exhausted: BudgetExhaustion | None = None


class CancellationSummary(_Frozen, frozen=True):
    """Who cancelled the run, the bounded reason, when, and how many active attempts it targeted."""

    requester: str
    reason: str
    at: int
    targets: int


class NodeSummary(_Frozen, frozen=True):
    """One node, in specification order: its status, attempts, outcome class and deadlines.

    ``attempt`` counts within the current activation, ``total_attempts`` over
    the whole run. ``reason`` is the bounded reason of a non-success outcome
    (empty for success). ``failure`` says why a node failed when its last
    outcome was not itself the failure (retries exhausted, ...), and
    ``failure_detail`` is the system's one-line explanation when the records
    were given. ``waiting_for`` names the signal a Waiting node's attempt
    waits for, and ``wait_deadline`` is when that wait expires (the token and
    any decision are never shown). Deadlines are absolute virtual milliseconds.
    """

    node_id: str
    handler: str
    policy: str
    status: NodeStatus
    attempt: int
    total_attempts: int
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    reason: str = ""
    failure: FailureCause | None = None
    failure_detail: str = ""
    attempt_deadline: int | None = None
    retry_deadline: int | None = None
    active_attempt_id: str | None = None
    child_run_id: str | None = None
    waiting_for: str | None = None
    wait_deadline: int | None = None


class AttemptSummary(_Frozen, frozen=True):
    """One consumed attempt identity: its node, outcome class (``None`` while active) and timing.

    ``reason`` is the bounded reason of a non-success outcome. ``attempt``,
    ``started_at`` and ``finished_at`` come from the journal records and are
    ``None`` when the records holding them were not given.
    """

    attempt_id: str
    node_id: str
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    reason: str = ""
    attempt: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    child_run_id: str | None = None


class BlockingDiagnostic(_Frozen, frozen=True):
    """Why a node is not progressing (or, for a non-success terminal node, why it stopped)."""

    node_id: str
    status: NodeStatus
    detail: str


class DiagnosticHistory(_Frozen, frozen=True):
    """Payload-free history lines, one per event, capped to the most recent.

    ``complete`` is the number of events in the run's history, ``retained``
    the number of lines kept here and ``omitted`` the rest
    (``complete == retained + omitted``).
    """

    lines: tuple[str, ...]
    complete: int
    retained: int
    omitted: int


class RunInspection(_Frozen, frozen=True):
    """A schema-versioned, payload-free view of one run, built by :func:`build_inspection`.

    ``status`` is the run's status word (:func:`~mayfly.inspect.run_status`,
    as every listing and CLI command words it): the terminal status,
    ``running``, or ``waiting`` for a running run that can only wait (for a
    signal, a backoff, a deadline or child runs that wait).
    ``result`` is the terminal result (``None`` while running), ``now`` the
    run's virtual time as of its last recorded fact and ``sequence`` the last
    event it reflects. Inspection is read-only, so ``now`` does not include
    the time since then: ``epoch_ms`` (the wall-clock time of virtual time 0,
    ``None`` for runs recorded before epochs) tells how much has passed, and
    the next resume first advances the run to it.
    ``source`` says whether the state came from a snapshot plus the journal
    tail or from the whole journal, with ``diagnostics`` explaining any
    snapshot that was discarded. ``journal_url`` has its password redacted.
    """

    schema_version: int
    run_id: str
    workflow_id: str
    workflow_version: int
    spec_hash: str
    status: str
    result: str | None
    now: int
    sequence: int
    source: Literal["snapshot", "journal"]
    budgets: BudgetUsage
    nodes: tuple[NodeSummary, ...]
    attempts: tuple[AttemptSummary, ...]
    blocking: tuple[BlockingDiagnostic, ...]
    history: DiagnosticHistory
    diagnostics: tuple[str, ...] = ()
    journal_url: str | None = None
    cancellation: CancellationSummary | None = None
    parent_run_id: str | None = None
    parent_node_id: str | None = None
    depth: int = 0
    epoch_ms: int | None = None
