"""The plugin: found through the ``mayfly`` entry point, opened by URL, described for ``mayfly backends``."""

from __future__ import annotations

from pathlib import Path

import pytest

import mayfly_lmdb
from mayfly.hookspecs import PLUGIN_API
from mayfly.plugins import PluginManager
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore, describe


def test_the_entry_point_serves_the_lmdb_scheme(url: str) -> None:
    """The installed entry point opens lmdb:// journals and lease stores of this distribution."""
    manager = PluginManager()
    assert mayfly_lmdb.MAYFLY_PLUGIN_API == PLUGIN_API
    journal = manager.open_journal(url)
    leases = manager.open_leases(url)
    try:
        assert isinstance(journal, LmdbJournal)
        assert isinstance(leases, LmdbLeaseStore)
    finally:
        leases.close()
        journal.close()


def test_backends_report_nosync_explicitly(url: str) -> None:
    """`mayfly backends` shows an explicit nosync journal as not surviving a host crash."""
    manager = PluginManager()
    rows = [row for row in manager.list_backends(url + "?durability=nosync") if row.scheme == "lmdb"]
    assert {row.kind for row in rows} == {"journal", "lease"}
    assert all(row.distribution == "mayfly-lmdb" for row in rows)
    assert all("nosync" in row.description and "NOT a host crash" in row.description for row in rows)


def test_descriptions_name_path_durability_and_map() -> None:
    """describe() names the directory, the durability and the map sizes; the bare scheme is generic."""
    line = describe("lmdb:///srv/env?map_size=64MiB&max_map_size=2GiB")
    assert "/srv/env" in line and "sync (durable" in line and "64MiB growing to 2GiB" in line
    assert "sync|nosync" in describe("lmdb://")


def test_a_workflow_runs_end_to_end_on_an_lmdb_url(url: str) -> None:
    """WorkflowRuntime given an lmdb:// URL runs a chain to success and leaves its history there."""
    from mayfly.model.outcomes import Succeeded
    from mayfly.model.spec import Node, WorkflowSpec
    from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime

    def step(request: HandlerRequest) -> Succeeded:
        return Succeeded(output={"node": request.node_id})

    registry = HandlerRegistry()
    registry.register("step", 1, step, cooperative=True)
    nodes = (Node("a", handler="step@1"), Node("b", handler="step@1", depends_on=("a",)))
    # snapshot_every=1: a snapshot after every commit (a run this short ends without one otherwise).
    result = WorkflowRuntime(url, registry, snapshot_every=1).execute(
        WorkflowSpec(workflow_id="lmdb.e2e", version=1, nodes=nodes)
    )
    assert result.succeeded
    assert result.outputs == {"a": {"node": "a"}, "b": {"node": "b"}}
    with LmdbJournal(url) as journal:
        assert journal.list_runs() == [result.run_id]
        assert len(journal.read(result.run_id)) == result.sequence
        assert journal.read_snapshot(result.run_id) is not None


def test_read_only_commands_refuse_a_missing_environment_and_create_nothing(tmp_path: Path) -> None:
    """`mayfly runs` on a mistyped lmdb:// path says there is no journal (exit 5) and creates nothing."""
    from mayfly.cli import main

    missing = tmp_path / "typo" / "env"
    assert main(["--journal", f"lmdb://{missing}", "runs"]) == 5
    assert not (tmp_path / "typo").exists()


def test_a_lease_held_refusal_says_when_the_lease_expires(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a backend whose leases expire, `mayfly cancel` of an owned run says who holds it and for how long."""
    from mayfly import Node, WorkflowSpec
    from mayfly.cli import main
    from mayfly.runtime import WorkflowRuntime

    url = f"lmdb://{tmp_path}/env"
    runtime = WorkflowRuntime(url)
    run_id = runtime.start(
        WorkflowSpec(workflow_id="held", version=1, nodes=(Node("n", handler="x@1"),))
    ).run_id
    with runtime.leases.acquire(run_id, "ops-console", 90_000):
        assert main(["--journal", url, "cancel", run_id, "--reason", "x"]) == 4
    message = capsys.readouterr().err
    assert (
        "held by ops-console" in message
        and "it expires in" in message
        and "unless its holder renews it" in message
    )
