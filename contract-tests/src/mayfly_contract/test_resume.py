"""Contract clause of a refused resume: it writes nothing and frees the run's lease at once."""

from __future__ import annotations

import time

import pytest

from mayfly.commit import commit_command
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.commands import AttemptStart, CreateRun, StartNodes
from mayfly.model.errors import ResumeRefused
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.model.state import RunStatus
from mayfly.runtime import HandlerRegistry, WorkflowRuntime

_HOUR_MS = 3_600_000


@pytest.mark.clause("recovery.resume.refusal-releases-lease")
def test_a_refused_resume_releases_the_lease_at_once(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str
) -> None:
    """A resume refused for a missing handler writes nothing; the same resume with it continues at once."""
    spec = WorkflowSpec("contract.resume", 1, (Node("ship", handler="publish@2"),))
    ids = DeterministicIdSource(7)
    state = commit_command(mayfly_journal, None, CreateRun(run_id=run_id, spec=spec), ids=ids).state
    attempt = ids.new_id()
    commit_command(mayfly_journal, state, StartNodes((AttemptStart("ship", attempt),)), ids=ids)
    before = mayfly_journal.read(run_id)

    # An hour-long lease: had the refusal kept it, a backend with lease expiry would hold the run an hour.
    without = WorkflowRuntime(mayfly_journal, HandlerRegistry(), leases=mayfly_leases, lease_ttl_ms=_HOUR_MS)
    with pytest.raises(ResumeRefused) as refused:
        without.resume(run_id)
    assert refused.value.missing == (("publish@2", ("ship",)),)
    assert mayfly_journal.read(run_id) == before

    registry = HandlerRegistry()
    registry.register("publish", 2, lambda req: Succeeded(output={"attempt": req.attempt_id}))
    started = time.monotonic()
    result = WorkflowRuntime(
        mayfly_journal, registry, leases=mayfly_leases, owner="contract-second", lease_ttl_ms=_HOUR_MS
    ).resume(run_id)
    assert time.monotonic() - started < 10, "the second resume must not wait for the first lease"
    assert result.status is RunStatus.SUCCEEDED
    assert result.outputs["ship"] == {"attempt": attempt}
