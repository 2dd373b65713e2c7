"""Typed node outcomes and artifact references (ADR-0032 "Typed outcomes and dependency policies").

An outcome is what one attempt of a node ended with. The seven kinds are
mechanically distinct: merely finishing never implies success. Every bound is
checked when an outcome is built *and* when one is decoded, so an oversized
output or reason can never enter history and is never truncated.
"""

from __future__ import annotations

import enum
import re
from typing import ClassVar, TypeAlias

import msgspec

from mayfly.model.errors import InvalidIdentifier, LimitExceeded
from mayfly.model.ids import is_uuid
from mayfly.model.json import JsonValue, check_finite
from mayfly.model.limits import MAX_EVIDENCE_REFS, MAX_INLINE_OUTPUT_BYTES, MAX_REASON_BYTES

__all__ = [
    "ArtifactRef",
    "BaseOutcome",
    "Blocked",
    "Cancelled",
    "ChangesRequested",
    "NodeOutcome",
    "NodeOutcomeKind",
    "PermanentFailure",
    "RetryableFailure",
    "Skipped",
    "Succeeded",
    "check_reason",
]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")
_OUTPUT_ENCODER = msgspec.json.Encoder()


class NodeOutcomeKind(enum.Enum):
    """The class of a node outcome."""

    SUCCEEDED = "succeeded"
    CHANGES_REQUESTED = "changes_requested"
    RETRYABLE_FAILURE = "retryable_failure"
    PERMANENT_FAILURE = "permanent_failure"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class ArtifactRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A reference to large, sensitive or independently governed content kept outside history."""

    artifact_id: str
    byte_length: int
    sha256: str
    media_type: str | None = None

    def __post_init__(self) -> None:
        if not is_uuid(self.artifact_id):
            raise InvalidIdentifier("artifact id", self.artifact_id, "expected a canonical UUID")
        if self.byte_length < 0:
            raise ValueError(f"artifact byte_length must be >= 0, got {self.byte_length}")
        if _SHA256.fullmatch(self.sha256) is None:
            raise ValueError(f"artifact sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.media_type is not None and _MEDIA_TYPE.fullmatch(self.media_type) is None:
            raise ValueError(f"artifact media_type {self.media_type!r} is not type/subtype")


def check_reason(reason: str, what: str = "reason") -> None:
    """Raise :class:`LimitExceeded` if ``reason`` is over 4 KiB of UTF-8, ValueError if not UTF-8."""
    try:
        size = len(reason.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8: {exc.reason} at {exc.start}") from None
    if size > MAX_REASON_BYTES:
        raise LimitExceeded(what, MAX_REASON_BYTES, size)


def _check_evidence(evidence: tuple[ArtifactRef, ...]) -> None:
    if len(evidence) > MAX_EVIDENCE_REFS:
        raise LimitExceeded("outcome evidence", MAX_EVIDENCE_REFS, len(evidence), "references")


class BaseOutcome(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", kw_only=True, gc=False
):  # acyclic immutable data: not tracked by the cycle collector
    """What every outcome has: its ``kind``, its ``evidence`` and a ``reason`` (``""`` for a success).

    Code that summarises any outcome reads ``outcome.reason`` directly; only
    the six non-success kinds record one, so a success's is always empty and
    is never written to history.
    """

    kind: ClassVar[NodeOutcomeKind]
    evidence: tuple[ArtifactRef, ...] = ()

    @property
    def reason(self) -> str:
        """Why the attempt ended this way; a success gives none."""
        return ""


class Succeeded(BaseOutcome, tag="succeeded", frozen=True):
    """The attempt succeeded; ``output`` (compact JSON, at most 64 KiB) is visible downstream."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.SUCCEEDED
    output: JsonValue = None

    def __post_init__(self) -> None:
        if self.evidence and len(self.evidence) > MAX_EVIDENCE_REFS:
            _check_evidence(self.evidence)
        if self.output is not None:
            try:
                size = len(_OUTPUT_ENCODER.encode(self.output))
            except (TypeError, msgspec.EncodeError) as exc:
                raise ValueError(f"output is not JSON-serializable: {exc}") from None
            check_finite(self.output, "output")
            if size > MAX_INLINE_OUTPUT_BYTES:
                raise LimitExceeded(
                    "inline output (use an ArtifactRef for large output)",
                    MAX_INLINE_OUTPUT_BYTES,
                    size,
                )


class _WithReason(BaseOutcome, frozen=True):
    reason: str = ""  # a field here: recorded, bounded to 4 KiB, part of the payload

    def __post_init__(self) -> None:
        # Every decoded outcome runs this (replay, snapshots): the common case, ASCII within the
        # bound, is settled by two C calls; anything else gets check_reason's exact UTF-8 count.
        if self.evidence and len(self.evidence) > MAX_EVIDENCE_REFS:
            _check_evidence(self.evidence)
        reason = self.reason
        if not (reason.isascii() and len(reason) <= MAX_REASON_BYTES):
            check_reason(reason)


class ChangesRequested(_WithReason, tag="changes_requested", frozen=True):
    """A corrective, non-terminal outcome: a correction edge may route the work back."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.CHANGES_REQUESTED


class RetryableFailure(_WithReason, tag="retryable_failure", frozen=True):
    """A transient failure; the node's retry policy decides whether another attempt runs.

    ``timeout`` marks failures recorded because a deadline expired.
    """

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.RETRYABLE_FAILURE
    timeout: bool = False


class PermanentFailure(_WithReason, tag="permanent_failure", frozen=True):
    """A failure no retry can fix (unless the retry policy names this class explicitly)."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.PERMANENT_FAILURE


class Blocked(_WithReason, tag="blocked", frozen=True):
    """A missing handler or external prerequisite stops this node."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.BLOCKED


class Cancelled(_WithReason, tag="cancelled", frozen=True):
    """The node was cancelled; cancellation is never failure and never success."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.CANCELLED


class Skipped(_WithReason, tag="skipped", frozen=True):
    """The node will not run because its branch was not selected or its policy can never be met."""

    kind: ClassVar[NodeOutcomeKind] = NodeOutcomeKind.SKIPPED


NodeOutcome: TypeAlias = (
    Succeeded | ChangesRequested | RetryableFailure | PermanentFailure | Blocked | Cancelled | Skipped
)
"""Any node outcome; JSON form is an object tagged by ``"kind"``."""
