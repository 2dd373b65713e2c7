"""Contract clauses of fencing: the journal accepts appends only under the newest lease grant."""

from __future__ import annotations

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import FencingRejected
from mayfly.plugins import open_leases
from mayfly_contract.support import Records

pytestmark = pytest.mark.capability("fencing")


@pytest.mark.clause("journal.fencing.unleased")
def test_unleased_run_accepts_no_fence(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """A run that was never leased has token 0 and accepts appends without a fence, or with 0."""
    assert mayfly_leases.current_fence(run_id) == 0
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1), fence=None)
    mayfly_journal.append(run_id, 2, records.batch(run_id, 2), fence=0)
    with pytest.raises(FencingRejected):
        mayfly_journal.append(run_id, 3, records.batch(run_id, 3), fence=1)


@pytest.mark.clause("journal.fencing.stale-rejected")
def test_stale_missing_and_future_tokens_are_rejected(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """After a newer grant, appends with an older, absent or never-granted token are rejected."""
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1))
    with mayfly_leases.acquire(run_id, "first", 30_000) as first:
        mayfly_journal.append(run_id, 2, records.batch(run_id, 2), fence=first.fencing_token)
    with mayfly_leases.acquire(run_id, "second", 30_000) as second:
        assert second.fencing_token > first.fencing_token
        for fence in (None, first.fencing_token, second.fencing_token + 1):
            with pytest.raises(FencingRejected) as caught:
                mayfly_journal.append(run_id, 3, records.batch(run_id, 3), fence=fence)
            assert caught.value.current == second.fencing_token
        assert mayfly_journal.next_sequence(run_id) == 3
        mayfly_journal.append(run_id, 3, records.batch(run_id, 3), fence=second.fencing_token)
    assert mayfly_journal.next_sequence(run_id) == 4


@pytest.mark.clause("lease.fencing.monotonic")
def test_tokens_strictly_increase_and_persist(
    mayfly_leases: RecoveryLeaseStore, mayfly_leases_url: str, run_id: str
) -> None:
    """Every grant's token exceeds all earlier ones for the run, also from a reopened store."""
    tokens = []
    for _ in range(3):
        with mayfly_leases.acquire(run_id, "one", 30_000) as guard:
            tokens.append(guard.fencing_token)
            assert mayfly_leases.current_fence(run_id) == guard.fencing_token
    with open_leases(mayfly_leases_url) as reopened, reopened.acquire(run_id, "two", 30_000) as guard:
        tokens.append(guard.fencing_token)
    assert tokens == sorted(set(tokens))
    assert tokens[0] >= 1
