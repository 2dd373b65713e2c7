"""Outcome limits: bounded output, reasons and evidence; never truncated."""

from __future__ import annotations

import msgspec
import pytest

from mayfly.model.errors import InvalidIdentifier, LimitExceeded
from mayfly.model.limits import MAX_INLINE_OUTPUT_BYTES, MAX_REASON_BYTES
from mayfly.model.outcomes import (
    ArtifactRef,
    BaseOutcome,
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    NodeOutcomeKind,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)

DIGEST = "a" * 64
ARTIFACT = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b"


def test_output_at_the_limit_is_accepted() -> None:
    """Compact JSON output of exactly 64 KiB is accepted."""
    text = "x" * (MAX_INLINE_OUTPUT_BYTES - 2)  # the two quotes make it exactly the limit
    assert len(msgspec.json.encode(text)) == MAX_INLINE_OUTPUT_BYTES
    assert Succeeded(output=text).output == text


def test_output_over_the_limit_names_the_limit() -> None:
    """One byte over 64 KiB raises LimitExceeded naming the limit and the observed size."""
    with pytest.raises(LimitExceeded) as info:
        Succeeded(output="x" * (MAX_INLINE_OUTPUT_BYTES - 1))
    assert info.value.limit == MAX_INLINE_OUTPUT_BYTES
    assert info.value.observed == MAX_INLINE_OUTPUT_BYTES + 1
    assert "ArtifactRef" in str(info.value)


def test_reason_limit_counts_utf8_bytes_not_characters() -> None:
    """A reason of 1,366 three-byte characters (4,098 bytes) is over the 4 KiB limit."""
    assert ChangesRequested(reason="€" * 1365).reason  # 4,095 bytes
    with pytest.raises(LimitExceeded) as info:
        Blocked(reason="€" * 1366)
    assert info.value.limit == MAX_REASON_BYTES
    assert info.value.observed == 4098


def test_an_ascii_reason_may_fill_4_kib_exactly_but_not_one_byte_more() -> None:
    """ASCII counts one byte a character: 4,096 are accepted, 4,097 refused with the observed size."""
    assert RetryableFailure(reason="x" * MAX_REASON_BYTES).reason
    with pytest.raises(LimitExceeded) as info:
        RetryableFailure(reason="x" * (MAX_REASON_BYTES + 1))
    assert (info.value.limit, info.value.observed) == (MAX_REASON_BYTES, MAX_REASON_BYTES + 1)


def test_reason_with_lone_surrogate_is_not_utf8() -> None:
    """A reason that cannot be encoded as UTF-8 is rejected, not mangled."""
    with pytest.raises(ValueError, match="UTF-8"):
        PermanentFailure(reason="bad \udcff")


def test_at_most_32_evidence_references() -> None:
    """An outcome may carry 32 evidence references but not 33."""
    ref = ArtifactRef(ARTIFACT, 10, DIGEST)
    assert len(Succeeded(evidence=(ref,) * 32).evidence) == 32
    with pytest.raises(LimitExceeded):
        RetryableFailure(reason="x", evidence=(ref,) * 33)


@pytest.mark.parametrize(
    ("artifact_id", "length", "digest", "media"),
    [
        ("not-a-uuid", 1, DIGEST, None),
        (ARTIFACT, -1, DIGEST, None),
        (ARTIFACT, 1, "A" * 64, None),
        (ARTIFACT, 1, "a" * 63, None),
        (ARTIFACT, 1, DIGEST, "text"),
    ],
)
def test_malformed_artifact_references_are_rejected(
    artifact_id: str, length: int, digest: str, media: str | None
) -> None:
    """Artifact refs need a UUID, a non-negative length, lowercase SHA-256 and type/subtype."""
    with pytest.raises((ValueError, InvalidIdentifier)):
        ArtifactRef(artifact_id, length, digest, media)


def test_decoding_enforces_the_same_limits() -> None:
    """An oversized outcome cannot enter through JSON either."""
    payload = b'{"kind":"blocked","reason":"' + b"x" * (MAX_REASON_BYTES + 1) + b'"}'
    with pytest.raises(msgspec.ValidationError, match="limit"):
        msgspec.json.decode(payload, type=NodeOutcome)


def test_each_outcome_class_reports_its_kind() -> None:
    """The seven outcome classes are mechanically distinct kinds."""
    kinds = {
        Succeeded().kind,
        ChangesRequested().kind,
        RetryableFailure().kind,
        PermanentFailure().kind,
        Blocked().kind,
    }
    assert kinds == {
        NodeOutcomeKind.SUCCEEDED,
        NodeOutcomeKind.CHANGES_REQUESTED,
        NodeOutcomeKind.RETRYABLE_FAILURE,
        NodeOutcomeKind.PERMANENT_FAILURE,
        NodeOutcomeKind.BLOCKED,
    }


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_not_json(number: float) -> None:
    """NaN and infinities would be written as null, so replay would differ from live: refused."""
    with pytest.raises(ValueError, match="non-finite"):
        Succeeded(output={"deep": [1, {"score": number}]})


def test_every_outcome_reads_its_reason_from_the_common_base() -> None:
    """Every outcome is a BaseOutcome with a reason: the one it records, or "" for a success."""
    outcomes: list[NodeOutcome] = [
        Succeeded(output=1),
        ChangesRequested(reason="tighten"),
        RetryableFailure(reason="flaky", timeout=True),
        PermanentFailure(reason="bad"),
        Blocked(reason="no key"),
        Cancelled(reason="stop"),
        Skipped(reason="branch"),
    ]
    assert all(isinstance(outcome, BaseOutcome) for outcome in outcomes)
    reasons = ["", "tighten", "flaky", "bad", "no key", "stop", "branch"]
    assert [outcome.reason for outcome in outcomes] == reasons


def test_a_success_records_no_reason() -> None:
    """A success's empty reason is not part of its payload, and a payload giving one is refused."""
    assert msgspec.json.encode(Succeeded(output=1)) == b'{"kind":"succeeded","output":1,"evidence":[]}'
    with pytest.raises(msgspec.ValidationError, match="reason"):
        msgspec.json.decode(b'{"kind":"succeeded","reason":"x"}', type=NodeOutcome)
