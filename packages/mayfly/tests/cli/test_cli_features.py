"""The mayfly command uses a backend's optional features only when the backend declares them.

A throwaway distribution (a ``dist-info`` directory on ``PYTHONPATH``) offers
two schemes over the local journal: ``kitdeclared://`` declares
``run_summaries`` and ``run_verification``; ``kitundeclared://`` has both
methods but declares neither, and its methods abort the process if called.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mayfly.commit import commit_command
from mayfly.ids import DeterministicIdSource
from mayfly.local import LocalWorkflowJournal
from mayfly.model.commands import CreateRun
from mayfly.model.spec import Node, WorkflowSpec

PLUGIN = '''
"""Two schemes over the local journal: one declares the optional features, one only has the methods."""

import msgspec

from mayfly.backend import backend_hooks
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal

MAYFLY_PLUGIN_API = 1


class Declared(LocalWorkflowJournal):
    def __init__(self, url):
        super().__init__("file://" + url.split("://", 1)[1])
        self._capabilities = msgspec.structs.replace(self._capabilities, run_summaries=True)

    def run_summaries(self, *, status=None, workflow_id=None, updated_before=None, limit=100):
        return []  # an index that lists nothing: `mayfly runs` must trust it


class Undeclared(LocalWorkflowJournal):
    def __init__(self, url):
        super().__init__("file://" + url.split("://", 1)[1])
        self._capabilities = msgspec.structs.replace(self._capabilities, run_verification=False)

    def run_summaries(self, **filters):
        raise SystemExit("run_summaries was called although the journal declares it absent")

    def verify_run(self, run_id):
        raise SystemExit("verify_run was called although the journal declares it absent")


def leases(url):
    return LocalLeaseStore("file://" + url.split("://", 1)[1])


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    ("kitdeclared",), "kitprobe", Declared, leases, summary="declares its features"
)
'''

SECOND = """
from kitprobe import MAYFLY_PLUGIN_API, Undeclared, leases

from mayfly.backend import backend_hooks

mayfly_journal_backends, mayfly_lease_backends = backend_hooks(("kitundeclared",), "kitprobe", Undeclared, leases)
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory holding the probe distribution: two plugin modules and their entry points."""
    root = tmp_path / "site"
    (root / "kitprobe-0.dist-info").mkdir(parents=True)
    (root / "kitprobe.py").write_text(textwrap.dedent(PLUGIN))
    (root / "kitprobe_undeclared.py").write_text(textwrap.dedent(SECOND))
    (root / "kitprobe-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kitprobe\nVersion: 0\n"
    )
    (root / "kitprobe-0.dist-info" / "entry_points.txt").write_text(
        "[mayfly]\nkitprobe = kitprobe\nkitprobe-undeclared = kitprobe_undeclared\n"
    )
    return root


@pytest.fixture
def run_id(tmp_path: Path) -> str:
    """A run created in the local store both schemes read."""
    spec = WorkflowSpec("kit.features", 1, (Node("a", handler="a@1"),))
    ids = DeterministicIdSource(11)
    run = ids.new_id()
    with LocalWorkflowJournal(f"file://{tmp_path}/store") as journal:
        commit_command(journal, None, CreateRun(run_id=run, spec=spec), ids=ids)
    return run


def mayfly(site: Path, journal: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the mayfly command with the probe distribution importable."""
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": path, "MAYFLY_JOURNAL": journal}
    return subprocess.run(
        [sys.executable, "-m", "mayfly", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_runs_pages_the_journal_when_summaries_are_not_declared(
    site: Path, tmp_path: Path, run_id: str
) -> None:
    """`mayfly runs` never calls a run_summaries method the backend does not declare; it lists by paging."""
    result = mayfly(site, f"kitundeclared://{tmp_path}/store", "runs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_id in result.stdout


def test_runs_trusts_the_index_a_backend_declares(site: Path, tmp_path: Path, run_id: str) -> None:
    """`mayfly runs` on a backend declaring run_summaries shows what the index returns (here: nothing)."""
    result = mayfly(site, f"kitdeclared://{tmp_path}/store", "runs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "no runs"


def test_replay_verifies_only_through_a_declared_feature(site: Path, tmp_path: Path, run_id: str) -> None:
    """`mayfly replay` skips a verify_run method the backend does not declare, and still replays the run."""
    result = mayfly(site, f"kitundeclared://{tmp_path}/store", "replay", run_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"run {run_id}: replayed 2 events" in result.stdout
