"""list_runs: a journal's runs listed and filtered with one call, as `mayfly runs` lists them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from inspect_runs import journal_at, review_registry, review_spec, run_review, run_until_approval

from mayfly import RunStatus, WorkflowRuntime, list_runs
from mayfly.cli import main
from mayfly.errors import BackendNotInstalled
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore
from mayfly.model.ids import DeterministicIdSource
from mayfly.plugins import PluginManager
from mayfly.substrate import VirtualClock


@pytest.fixture
def journal_dir(tmp_path: Path) -> Path:
    """A journal holding a succeeded review run, a run parked on approval and a second review run."""
    run_review(tmp_path, namespace=3)
    run_until_approval(tmp_path)
    journal = journal_at(tmp_path)
    runtime = WorkflowRuntime(
        journal,
        review_registry(),
        leases=LocalLeaseStore(journal.url),
        clock=VirtualClock,
        ids=DeterministicIdSource(namespace=9),
    )
    assert runtime.execute(review_spec()).succeeded
    return tmp_path


def test_list_runs_filters_by_state_workflow_and_limit(journal_dir: Path) -> None:
    """One call lists the runs; state, workflow and limit filter them, and waiting runs name their waits."""
    url = f"file://{journal_dir}/journal?durability=write"
    every = list_runs(url)
    assert sorted((r.workflow, r.status) for r in every) == [
        ("demo.approval@1", "waiting"),
        ("demo.review@1", "succeeded"),
        ("demo.review@1", "succeeded"),
    ]
    (waiting,) = list_runs(url, state="waiting")
    assert (waiting.workflow, waiting.waiting_on, waiting.nodes_done, waiting.nodes) == (
        "demo.approval@1",
        ("approval",),
        1,
        3,
    )
    assert list_runs(url, state=RunStatus.RUNNING) == [waiting]  # parked runs are running runs
    assert [r.workflow for r in list_runs(url, state="succeeded", workflow="demo.review")] == [
        "demo.review@1",
        "demo.review@1",
    ]
    assert list_runs(url, workflow="demo.approval") == [waiting]
    assert len(list_runs(url, limit=1)) == 1
    assert list_runs(url, state=RunStatus.FAILED) == []


def test_list_runs_is_what_mayfly_runs_prints(journal_dir: Path) -> None:
    """`mayfly --json runs` prints exactly the listing of list_runs, field by field."""
    url = f"file://{journal_dir}/journal?durability=write"
    out, err = io.StringIO(), io.StringIO()
    assert main(["--journal", url, "--json", "runs", "--state", "waiting"], out=out, err=err) == 0
    (row,) = json.loads(out.getvalue())
    (listing,) = list_runs(url, state="waiting")
    assert row == {
        "run_id": listing.run_id,
        "workflow": listing.workflow,
        "status": listing.status,
        "nodes_done": listing.nodes_done,
        "nodes": listing.nodes,
        "waiting_on": ",".join(listing.waiting_on),
    }


def test_an_unreadable_history_is_listed_without_filters_and_skipped_with_them(journal_dir: Path) -> None:
    """A run whose history does not decode shows as unreadable (with why) and never hides other runs."""
    journal = journal_at(journal_dir)
    run_id = DeterministicIdSource(namespace=12).new_id()
    future = JournalRecord.seal(
        run_id=run_id,
        sequence=1,
        event_id=DeterministicIdSource(namespace=13).new_id(),
        event_type="RunRenamed",
        schema_version=1,
        payload=b'{"type":"RunRenamed"}',
    )
    journal.append(run_id, 1, [future])
    rows = {r.run_id: r for r in list_runs(journal)}
    assert len(rows) == 4
    assert (rows[run_id].status, rows[run_id].workflow) == ("unreadable", "?")
    assert "unknown event type 'RunRenamed'" in rows[run_id].error
    assert run_id not in {r.run_id for r in list_runs(journal, state="succeeded")}


def test_the_plugin_context_opens_the_url(journal_dir: Path) -> None:
    """A URL is opened through the given plugin context: one serving no file:// cannot list it."""
    with pytest.raises(BackendNotInstalled, match="file://"):
        list_runs(f"file://{journal_dir}/journal", plugins=PluginManager(load_entry_points=False, environ={}))


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"state": "parked"}, "state must be one of"), ({"limit": 0}, "limit")]
)
def test_bad_filters_are_refused(journal_dir: Path, kwargs: dict[str, object], message: str) -> None:
    """An unknown state or a limit below 1 raises ValueError naming the filter."""
    with pytest.raises(ValueError, match=message):
        list_runs(f"file://{journal_dir}/journal", **kwargs)  # type: ignore[arg-type]
