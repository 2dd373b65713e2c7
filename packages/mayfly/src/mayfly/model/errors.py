"""The one exception hierarchy every Mayfly layer and backend raises.

Backends map their driver errors into these classes, so a user never has to
catch ``psycopg.OperationalError`` or ``lmdb.Error``. Every message is one line
that names the operation, the identity involved and the limit or expectation
that was broken (ADR-0032 "Security and safety": fail closed, loudly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

__all__ = [
    "AppendConflict",
    "BackendNotInstalled",
    "ChecksumMismatch",
    "CommandRejected",
    "CompatibilityError",
    "ConflictingRecord",
    "CorruptionError",
    "Deadlock",
    "DuplicateRun",
    "DurabilityUnavailable",
    "FencingRejected",
    "HandlerUnavailable",
    "HistoryLost",
    "HubAlreadyRunning",
    "HubNotRunning",
    "InvalidBackendURL",
    "InvalidIdentifier",
    "InvalidJSONValue",
    "InvalidRecord",
    "InvalidSignalToken",
    "JournalError",
    "JournalGap",
    "JournalUnavailable",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "LimitExceeded",
    "MayflyError",
    "NonRetryable",
    "OffloadTimeout",
    "PluginError",
    "ResumeRefused",
    "RunNotFound",
    "SnapshotCorrupt",
    "SpecDecodeError",
    "SpecValidationError",
    "SubstrateError",
    "TaskCancelled",
    "TaskFailed",
    "TaskNotDone",
    "ValidationIssue",
    "WaitTimeout",
]


class MayflyError(Exception):
    """Base class of every error Mayfly raises on purpose."""


@final
class ValidationIssue:
    """One problem found in a specification, located by a path such as ``nodes[review].depends_on[2]``."""

    __slots__ = ("message", "path")

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def __repr__(self) -> str:
        return f"ValidationIssue({self.path!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ValidationIssue) and other.path == self.path and other.message == self.message
        )

    def __hash__(self) -> int:
        return hash((self.path, self.message))


class SpecValidationError(MayflyError, ValueError):
    """A workflow specification is invalid; ``issues`` lists every problem at once."""

    def __init__(self, issues: Sequence[ValidationIssue]) -> None:
        self.issues = tuple(issues)
        count = len(self.issues)
        head = "; ".join(str(issue) for issue in self.issues[:5])
        more = f" (and {count - 5} more)" if count > 5 else ""
        super().__init__(f"invalid workflow specification ({count} problem(s)): {head}{more}")


class InvalidIdentifier(MayflyError, ValueError):
    """A string is not a valid identity of the given kind (the value is shown, repr-quoted)."""

    def __init__(self, kind: str, value: object, rule: str) -> None:
        self.kind = kind
        self.value = value
        self.rule = rule
        super().__init__(f"invalid {kind} {value!r}: {rule}")


class LimitExceeded(MayflyError, ValueError):
    """A bounded value is over its limit; nothing was truncated and nothing was written."""

    def __init__(self, what: str, limit: int, observed: int, unit: str = "bytes") -> None:
        self.what = what
        self.limit = limit
        self.observed = observed
        self.unit = unit
        super().__init__(f"{what} is {observed} {unit}, over the limit of {limit} {unit}")


class CompatibilityError(MayflyError):
    """A version (event, snapshot, spec, handler contract) is unknown or incompatible; fail closed."""


class HandlerUnavailable(CompatibilityError):
    """A handler named by a specification is not registered, or not compatible with its pinned version."""


class CorruptionError(MayflyError):
    """Recorded history contradicts itself: a gap, a bad checksum, a second conflicting outcome."""


class CommandRejected(MayflyError):
    """``commit_command`` was asked to commit a command that ``decide`` rejected; nothing was written.

    ``rejection`` is the typed :class:`mayfly.model.commands.Rejection` value.
    """

    def __init__(self, rejection: object, message: str) -> None:
        self.rejection = rejection
        super().__init__(message)


class JournalError(MayflyError):
    """A journal operation failed; the message names the operation and the run."""


class JournalUnavailable(JournalError):
    """The journal's store could not be reached or opened; the operation may be retried."""


class DurabilityUnavailable(JournalError):
    """The store cannot meet the durability policy it was asked for, so it refuses to acknowledge."""


class AppendConflict(JournalError):
    """Compare-and-append failed: the journal's next sequence is not the one the caller expected."""

    def __init__(self, run_id: str, expected_next: int, actual_next: int) -> None:
        self.run_id = run_id
        self.expected_next = expected_next
        self.actual_next = actual_next
        super().__init__(
            f"append rejected: run {run_id} expected next sequence {expected_next}, "
            f"journal is at {actual_next}"
        )


class DuplicateRun(JournalError):
    """A submission's deduplication id is held by a live run of the same queue; nothing was written."""

    def __init__(self, run_id: str, queue: str, dedup_id: str, live_run_id: str | None) -> None:
        self.run_id = run_id
        self.queue = queue
        self.dedup_id = dedup_id
        self.live_run_id = live_run_id
        """The live run that holds the id (``None`` if it ended between the refusal and the lookup)."""
        held = f"run {live_run_id}" if live_run_id else "a live run"
        super().__init__(
            f"run {run_id} was not created: dedup id {dedup_id!r} on queue {queue} belongs to {held}, "
            "which has not ended; use that run, or submit again once it ends"
        )


class FencingRejected(JournalError):
    """An append carried a fencing token older than the newest lease grant for the run."""

    def __init__(self, run_id: str, presented: int, current: int) -> None:
        self.run_id = run_id
        self.presented = presented
        self.current = current
        super().__init__(
            f"append rejected: run {run_id} fencing token {presented} is stale, "
            f"the current lease holds token {current}"
        )


class ConflictingRecord(JournalError, CorruptionError):
    """A record differs from one already committed under the same sequence or event id."""


class JournalGap(JournalError, CorruptionError):
    """Records of a run are not contiguous: a sequence is missing."""


class ChecksumMismatch(JournalError, CorruptionError):
    """A stored record's checksum does not match its bytes."""


class LeaseError(MayflyError):
    """A recovery-lease operation failed."""


class LeaseHeld(LeaseError):
    """Another owner holds the recovery lease of the run; acquisition is non-blocking and refused."""

    def __init__(self, run_id: str, holder: str | None = None, *, expires_in_ms: int | None = None) -> None:
        self.run_id = run_id
        self.holder = holder
        self.expires_in_ms = expires_in_ms
        """How long the lease lasts unless renewed, where the backend's leases expire (else ``None``)."""
        who = f" by {holder}" if holder else ""
        until = (
            ""
            if expires_in_ms is None
            else f" (it expires in {max(0, expires_in_ms) / 1000:.1f} s unless renewed)"
        )
        super().__init__(f"recovery lease of run {run_id} is held{who}{until}; try again later")


class LeaseLost(LeaseError):
    """The lease expired or was taken over; the guard may no longer renew or append."""


class BackendNotInstalled(MayflyError):
    """No installed plugin serves a URL scheme; the message names the distribution to install."""

    def __init__(self, scheme: str, distribution: str | None) -> None:
        self.scheme = scheme
        self.distribution = distribution
        if distribution:
            hint = f'pip install "{distribution}"'
            super().__init__(f"{scheme}:// needs: {hint}")
        else:
            super().__init__(
                f"no installed Mayfly backend serves {scheme}://; run `mayfly backends` to list them"
            )


# --- Execution substrate (mayfly.substrate, ADR-0033 "one execution owner") ---


class SubstrateError(MayflyError):
    """The greenlet hub refused an operation or could not complete it."""


class HubNotRunning(SubstrateError, RuntimeError):
    """A substrate function was called outside a task of a running hub."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        super().__init__(f"{operation}() needs a running hub: call it from a task started by Hub.run(...)")


class HubAlreadyRunning(SubstrateError, RuntimeError):
    """A second hub (or a nested ``Hub.run``) was started on a thread that already runs one."""


class Deadlock(SubstrateError):
    """Every task is parked with no timer, offloaded call or fd wait that could ever wake one."""

    def __init__(self, parked: Sequence[str]) -> None:
        self.parked = tuple(parked)
        shown = ", ".join(repr(name) for name in self.parked[:10])
        more = f" (and {len(self.parked) - 10} more)" if len(self.parked) > 10 else ""
        super().__init__(
            f"deadlock: {len(self.parked)} task(s) parked with nothing left to wake them: "
            f"{shown}{more}; set an Event, send on the Channel or add a timeout"
        )


class TaskCancelled(SubstrateError):
    """A task was cancelled; raised at its park point, and by ``join``/``result`` of that task."""

    def __init__(self, task_name: str, reason: str) -> None:
        self.task_name = task_name
        self.reason = reason
        super().__init__(f"task {task_name!r} was cancelled: {reason}")


class TaskFailed(SubstrateError):
    """A task ended with an exception; the original is ``__cause__``, type and message are bounded.

    ``error_type`` is the qualified class name and ``error_message`` at most
    4 KiB of UTF-8, so both can be recorded durably as they are.
    """

    def __init__(self, task_name: str, error_type: str, error_message: str) -> None:
        self.task_name = task_name
        self.error_type = error_type
        self.error_message = error_message
        super().__init__(f"task {task_name!r} failed with {error_type}: {error_message}")


class TaskNotDone(SubstrateError):
    """The outcome of a task was asked for before the task finished; join it first."""


class WaitTimeout(SubstrateError, TimeoutError):
    """A substrate wait (join, event, channel, fd readiness) reached its timeout."""


class OffloadTimeout(WaitTimeout):
    """An offloaded call did not finish within its timeout; its late result will be discarded."""


class InvalidRecord(JournalError, ValueError):
    """A journal record, snapshot or append argument is malformed; nothing was written."""


class SnapshotCorrupt(CorruptionError):
    """A stored snapshot is unreadable, fails its checksum or has an unknown version; discard it."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(
            f"snapshot of run {run_id} is unusable ({reason}); discard it and rebuild from events"
        )


class InvalidBackendURL(MayflyError, ValueError):
    """A backend URL is malformed or carries an unknown option; nothing was opened."""


class PluginError(MayflyError):
    """A plugin could not be loaded or clashes with another plugin; the message names both."""


class RunNotFound(MayflyError, LookupError):
    """The journal holds no history for the run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} not found in this journal; check the run id and --journal")


class HistoryLost(JournalError, CorruptionError):
    """Committed records of a run are provably missing: something that saw them reaches beyond the journal.

    A snapshot, or a local offset hint, records that the run's history went up
    to a point the readable journal no longer reaches. That is not a stale
    cache to discard: the records it covered were acknowledged, and a resume
    that carried on from the shorter history would re-run work that already
    happened and overwrite what was recorded. ``evidence`` says what proves
    the loss; ``remedy`` what the operator can do.
    """

    def __init__(self, run_id: str, evidence: str, *, remedy: str) -> None:
        self.run_id = run_id
        self.evidence = evidence
        self.remedy = remedy
        super().__init__(f"run {run_id} lost committed records: {evidence}; {remedy}")


# --- Resume refused for missing handlers (ARCHITECTURE section 11, "Missing handlers") ---


class ResumeRefused(HandlerUnavailable):
    """Resume refused: handlers the run's unfinished nodes need are not registered or not compatible.

    ``missing`` pairs each ``name@version`` contract nothing serves with the
    unfinished nodes that need it (``node/child-node`` inside a called
    workflow). Nothing was written and the run's lease was released: the
    same resume with those handlers registered continues the run.
    """

    def __init__(self, run_id: str, missing: Sequence[tuple[str, Sequence[str]]]) -> None:
        self.run_id = run_id
        self.missing = tuple((handler, tuple(nodes)) for handler, nodes in missing)
        shown = ", ".join(f"{handler} -> {_listed(nodes, 5)}" for handler, nodes in self.missing[:10])
        more = f" (and {len(self.missing) - 10} more)" if len(self.missing) > 10 else ""
        super().__init__(
            f"resume refused: run {run_id} needs handler(s) that are not registered or not compatible: "
            f"{shown}{more}; nothing was written"
        )


def _listed(names: Sequence[str], limit: int) -> str:
    """``node a`` / ``nodes a, b (and 3 more)``: a bounded list for a one-line message."""
    head = ", ".join(names[:limit])
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return f"{'node' if len(names) == 1 else 'nodes'} {head}{more}"


# --- Bad input at the entry points (specification JSON, JSON values, signal tokens) ---


def one_line(text: str) -> str:
    """``text`` with control characters escaped, for a message quoting input (msgspec quotes it raw)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SpecDecodeError(SpecValidationError):
    """A specification's JSON cannot be decoded: malformed JSON, a wrong type, an unknown field.

    ``path`` locates the problem the way msgspec does (``$.nodes[0].handler``;
    ``$`` when the document as a whole is at fault) and ``problem`` says what
    was expected and found. It is a :class:`SpecValidationError` with that one
    issue, so code that handles invalid specifications handles this too.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        self.issues = (ValidationIssue(path, problem),)
        MayflyError.__init__(self, f"workflow specification JSON is invalid at {path}: {problem}")


class InvalidJSONValue(MayflyError, ValueError):
    """A value bound for durable JSON (an input, a signal decision) is not JSON; nothing was written.

    Not serializable, a NaN or infinity (JSON has none: it would come back as
    ``null``), or an integer too long for a JSON decoder to read back.
    """


class InvalidSignalToken(MayflyError, ValueError):
    """A signal token is malformed; the message states the rule and never shows the token."""


class NonRetryable(Exception):  # raised by handler code, so deliberately not a MayflyError
    """Raise from a handler to fail the attempt permanently instead of retrying it.

    The attempt's outcome is a ``PermanentFailure`` whose reason names the
    exception's type and message (``handler raised NonRetryable: sku 42 is
    discontinued``), and the cause's when raised ``from`` another exception.
    Subclass it to name your own permanent errors. A retry policy that lists
    ``permanent_failure`` in ``retry_on`` still retries it.
    """
