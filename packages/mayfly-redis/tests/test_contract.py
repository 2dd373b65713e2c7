"""Certification: the whole mayfly-contract suite passes on every Redis deployment this backend serves.

Each deployment runs the suite in its own pytest process (as ``pytest --pyargs
mayfly_contract`` would in CI) so its certification report is the real one; on
failure the report is shown.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from mayfly_redis.testing import memory_url

UNOFFERED_FEATURE_CLAUSES = {
    "journal.summaries.listed",
    "journal.summaries.filters-and-pages",
    "journal.summaries.inputs",
    "journal.tails.match-reads",
    "journal.tails.inspect-equal",
    "journal.tails.corrupt-snapshot",
    "journal.tails.fails-closed",
    "journal.tails.inputs",
    "journal.verification.counts",
    "journal.verification.fails-closed",
}

DEPLOYMENTS = {
    "aof-standalone": ["-o", "mayfly_backend=mayfly_redis.testing:aof_backend"],
    "aof-cluster": ["-o", "mayfly_backend=mayfly_redis.testing:cluster_backend"],
    "memory-standalone": ["--mayfly-journal", memory_url()],
}


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_contract_suite_certifies(deployment: str) -> None:
    """The contract suite reports CERTIFIED with no failed clause for the deployment."""
    tripwire = ["-p", "asyncio_tripwire"] if importlib.util.find_spec("asyncio_tripwire") else []
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *tripwire,
            "--pyargs",
            "mayfly_contract",
            *DEPLOYMENTS[deployment],
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = completed.stdout[completed.stdout.find("mayfly contract certification") :]
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-2000:]
    assert "verdict: CERTIFIED" in report
    assert " 0 failed" in report
    if deployment.startswith("aof"):
        # Every capability is declared; only clauses of the optional features Redis does not offer
        # (an index of run summaries, batched run tails, a verification beyond what reads check) are
        # skipped.
        skipped = {line.split()[1] for line in report.splitlines() if line.startswith("  SKIP ")}
        if deployment.endswith("cluster"):
            # A Cluster store shards its run index over slots (docs/backends/redis.md, "Redis
            # Cluster"): every run-index clause runs, queue control is not offered and its clauses skip.
            queue_clauses = {name for name in skipped if name.startswith("queues.")}
            assert queue_clauses and "queue_control=no" in report, report
            assert "run_index=yes" in report and "run_wakeups=yes" in report, report
            assert not any(name.startswith("runindex.") for name in skipped), report
            skipped -= queue_clauses
            # Nor does it list its leases (docs/backends/redis.md): they sit in every shard's slots.
            listing_clauses = {name for name in skipped if name.startswith("lease.listing.")}
            assert listing_clauses and "lease_listing=no" in report, report
            skipped -= listing_clauses
        else:
            assert "run_index=yes" in report and "run_wakeups=yes" in report, report
            assert "queue_control=yes" in report and "lease_listing=yes" in report, report
        assert skipped == UNOFFERED_FEATURE_CLAUSES, report
        assert "PASS journal.hub.never-blocks" in report
        assert "durability: durable" in report
    else:
        assert "durability: memory" in report
