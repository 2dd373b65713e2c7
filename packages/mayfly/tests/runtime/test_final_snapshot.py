"""When a run that ends writes a last snapshot: only after a tail long enough to be worth one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.local import LocalWorkflowJournal
from mayfly.runtime import WorkflowRuntime
from mayfly.runtime._driver import FINAL_SNAPSHOT_RECORDS


def chain(length: int) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler="ok@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(length)
    )
    return WorkflowSpec(workflow_id="final.snapshot", version=1, nodes=nodes)


def run(tmp_path: Path, length: int, **options: Any) -> tuple[LocalWorkflowJournal, str, int]:
    registry = HandlerRegistry()
    registry.register("ok", 1, lambda req: Succeeded(), cooperative=True)
    url = f"file://{tmp_path}/store?durability=write"
    result = WorkflowRuntime(url, registry, **options).execute(chain(length))
    assert result.succeeded
    journal = LocalWorkflowJournal(url)
    return journal, result.run_id, journal.next_sequence(result.run_id) - 1


def test_a_short_run_ends_without_a_snapshot(tmp_path: Path) -> None:
    """A 10-node run (32 records) is cheaper to replay than a snapshot is to write: none is written."""
    journal, run_id, records = run(tmp_path, 10)
    assert records < FINAL_SNAPSHOT_RECORDS
    assert journal.read_snapshot(run_id) is None


def test_a_long_run_ends_with_a_snapshot_of_its_final_state(tmp_path: Path) -> None:
    """A run whose tail since its last snapshot reaches the threshold writes one at its last record."""
    journal, run_id, records = run(tmp_path, 40)
    assert records >= FINAL_SNAPSHOT_RECORDS
    snapshot = journal.read_snapshot(run_id)
    assert snapshot is not None and snapshot.last_sequence == records


def test_a_smaller_snapshot_every_bounds_the_tail_left_unsnapshotted(tmp_path: Path) -> None:
    """With snapshot_every below the threshold, a finished run's last snapshot is fewer records behind."""
    journal, run_id, records = run(tmp_path, 10, snapshot_every=7)
    snapshot = journal.read_snapshot(run_id)
    assert snapshot is not None and records - snapshot.last_sequence < 7
