"""Chaos: PostgreSQL crashes (immediate shutdown) and restarts in the middle of a run; nothing is lost."""

from __future__ import annotations

import collections
import time
from typing import Any

from hostworker import chain
from pgserver import IDS, PrivateCluster, with_options
from test_multihost import events, spawn_worker

from mayfly.model.errors import JournalUnavailable
from mayfly.model.events import NodeOutcomeCommitted, RunCompleted
from mayfly_postgres import PostgresJournal

NODES = 60


def test_run_survives_a_server_crash_and_restart(private_cluster: PrivateCluster) -> None:
    """A 60-step run whose server crashes mid-run completes after the restart with every record kept once."""
    url = with_options(private_cluster.url, schema="chaos", reconnect_timeout=60)
    run = IDS.new_id()
    with PostgresJournal(url) as journal:  # migrates the schema before the worker starts
        worker = spawn_worker("chain", url, run, str(NODES))
        try:
            deadline = time.monotonic() + 60
            while journal.next_sequence(run) < 40:
                assert worker.poll() is None, worker.communicate()
                assert time.monotonic() < deadline, "the run made no progress"
                time.sleep(0.02)
            before = journal.read(run)
            private_cluster.crash_restart()
            crashed_at = journal.next_sequence(run)
            out, err = worker.communicate(timeout=180)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert out.split() == ["done", "succeeded"]
        after = _read_when_back(journal, run)
    assert "RunCompleted" not in {r.event_type for r in before}, "the crash came after the run ended"
    assert len(before) <= crashed_at - 1 < len(after), "the run did not continue after the restart"
    assert after[: len(before)] == before, "records acknowledged before the crash were lost or changed"
    assert [r.sequence for r in after] == list(range(1, len(after) + 1))
    assert len({r.event_id for r in after}) == len(after)
    with PostgresJournal(url) as journal:
        history = events(journal, run)
    outcomes = collections.Counter(e.node_id for e in history if isinstance(e, NodeOutcomeCommitted))
    assert outcomes == {node.id: 1 for node in chain(NODES).nodes}
    assert sum(isinstance(e, RunCompleted) for e in history) == 1


def _read_when_back(journal: PostgresJournal, run: str) -> list[Any]:
    """Read the run, waiting out the restart if the server is still recovering."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return journal.read(run)
        except JournalUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.2)
