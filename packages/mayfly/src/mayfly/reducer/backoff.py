"""Deterministic retry delays: the backoff schedule plus optional FNV-1a jitter.

Pure arithmetic over the pinned policy and identities: replay never recomputes
a delay (``RetryScheduled`` stores the absolute deadline), but the same inputs
always give the same answer, so a decision can be re-derived and checked.
"""

from __future__ import annotations

from mayfly.model.spec import ExponentialBackoff, FixedBackoff, ImmediateBackoff, RetryPolicy

__all__ = ["backoff_delay", "fnv1a_64", "jitter", "retry_delay"]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF
_SEPARATOR = b"\x1f"


def fnv1a_64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data``."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def jitter(seed: str, run_id: str, node_id: str, next_attempt: int, maximum_ms: int) -> int:
    """Jitter in ``0..=maximum_ms``: FNV-1a-64 over ``seed``, run id, node id and attempt.

    The four fields are UTF-8 encoded (the attempt as a decimal number) and
    joined by the byte 0x1F; the jitter is ``hash % (maximum_ms + 1)``.
    """
    if maximum_ms <= 0:
        return 0
    data = _SEPARATOR.join((seed.encode(), run_id.encode(), node_id.encode(), str(next_attempt).encode()))
    return fnv1a_64(data) % (maximum_ms + 1)


def backoff_delay(policy: RetryPolicy, next_attempt: int) -> int:
    """The schedule's delay in ms before attempt ``next_attempt`` (>= 2), without jitter."""
    backoff = policy.backoff
    if isinstance(backoff, ImmediateBackoff):
        return 0
    if isinstance(backoff, FixedBackoff):
        return backoff.delay_ms
    assert isinstance(backoff, ExponentialBackoff)
    exponent = max(next_attempt - 2, 0)
    # Compare before multiplying further so huge attempt counts cannot build huge integers.
    delay = backoff.initial_ms
    for _ in range(exponent):
        if delay >= backoff.maximum_ms:
            break
        delay *= backoff.multiplier
    return min(delay, backoff.maximum_ms)


def retry_delay(policy: RetryPolicy, next_attempt: int, *, seed: str, run_id: str, node_id: str) -> int:
    """Backoff delay plus jitter for ``next_attempt`` of ``node_id`` in ``run_id``."""
    return backoff_delay(policy, next_attempt) + jitter(
        seed, run_id, node_id, next_attempt, policy.jitter_max_ms
    )
