"""Third-party plugins installed through their entry points take effect through the API and the CLI.

The distributions under ``dists/`` are installed with pip into test
environments (``installed.py``); every command and script runs in a fresh
process of that environment, as a user's would.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from installed import install, run, v1_fixture

POLICY = "acme policy: handlers in the unsafe. namespace are not allowed (unsafe.wipe@1)"
CLASH = (
    "upcaster for NodeReady version 1 is registered by both plugin 'acme-conflict' and plugin 'acme-policy'"
)


@pytest.fixture(scope="module")
def policy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test environment with mayfly-acme-policy installed."""
    return install(tmp_path_factory.mktemp("policy") / "site", "mayfly-acme-policy")


@pytest.fixture(scope="module")
def clashing_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test environment with mayfly-acme-policy and mayfly-acme-conflict installed."""
    return install(tmp_path_factory.mktemp("clash") / "site", "mayfly-acme-policy", "mayfly-acme-conflict")


HANDLERS = """
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()

@registry.handler("unsafe.wipe")
def wipe(req):
    return Succeeded(output={"wiped": True})

@registry.handler("b")
def b(req):
    return Succeeded(output={"b": True})
"""

UNSAFE_SPEC = {
    "workflow_id": "acme.cleanup",
    "version": 1,
    "nodes": [{"id": "wipe", "handler": "unsafe.wipe@1"}],
}

EXECUTE = """
import json, sys
import mayfly
from mayfly.errors import SpecValidationError
from handlers import registry

spec = mayfly.WorkflowSpec.from_json(open("spec.json", "rb").read())
runtime = mayfly.WorkflowRuntime(sys.argv[1], registry)
print(json.dumps([str(issue) for issue in runtime.validate(spec)]))
try:
    runtime.execute(spec)
except SpecValidationError as refused:
    print("refused:", refused)
else:
    print("executed")
"""


def write(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(textwrap.dedent(text))


def test_an_installed_validator_refuses_a_spec_through_mayfly_run(tmp_path: Path, policy_site: Path) -> None:
    """`mayfly run` exits 2 with the plugin's message, creating no journal; without the plugin it runs."""
    write(tmp_path, "spec.json", json.dumps(UNSAFE_SPEC))
    write(tmp_path, "handlers.py", HANDLERS)
    journal = tmp_path / "journal"
    refused = run(
        policy_site, f"file://{journal}", "run", "spec.json", "--handlers", "handlers.py", cwd=tmp_path
    )
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("mayfly: error: ")
    assert f"nodes[wipe].handler: {POLICY}" in refused.stderr
    assert not journal.exists()

    bare = run(None, f"file://{journal}", "run", "spec.json", "--handlers", "handlers.py", cwd=tmp_path)
    assert bare.returncode == 0, (bare.stdout, bare.stderr)


def test_an_installed_validator_refuses_a_spec_through_the_api(tmp_path: Path, policy_site: Path) -> None:
    """WorkflowRuntime.validate reports the plugin's issue and execute raises SpecValidationError with it."""
    write(tmp_path, "spec.json", json.dumps(UNSAFE_SPEC))
    write(tmp_path, "handlers.py", HANDLERS)
    write(tmp_path, "execute.py", EXECUTE)
    url = f"file://{tmp_path}/journal"
    done = run(policy_site, url, "execute.py", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    issues, outcome = done.stdout.splitlines()
    assert json.loads(issues) == [f"nodes[wipe].handler: {POLICY}"]
    assert outcome.startswith("refused: invalid workflow specification (1 problem(s))") and POLICY in outcome
    bare = run(None, url, "execute.py", url, cwd=tmp_path)
    assert bare.stdout.splitlines() == ["[]", "executed"], bare.stderr


REPLAY = """
import sys
import mayfly

recovered = mayfly.WorkflowRuntime(sys.argv[1]).replay(sys.argv[2])
print(recovered.state.status.value, [(n.node_id, n.status.value) for n in recovered.state.nodes])
"""


def test_an_installed_upcaster_upgrades_a_v1_event_on_every_read_path(
    tmp_path: Path, policy_site: Path
) -> None:
    """replay, inspect and resume read a v1 NodeReady through the plugin's upcaster, by CLI and API."""
    url = f"file://{tmp_path}/journal"
    run_id = v1_fixture(url)
    bare = run(None, url, "replay", run_id, cwd=tmp_path, future=True)
    assert bare.returncode == 5 and "no upcaster registered for NodeReady v1 -> v2" in bare.stderr

    replayed = run(policy_site, url, "--json", "replay", run_id, cwd=tmp_path, future=True)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["events"] == 5
    inspected = run(policy_site, url, "--json", "inspect", run_id, cwd=tmp_path, future=True)
    assert [(n["node_id"], n["status"]) for n in json.loads(inspected.stdout)["nodes"]] == [
        ("a", "succeeded"),
        ("b", "ready"),
    ]
    assert "#2 NodeReady a ready (initial)" in json.loads(inspected.stdout)["history"]["lines"]
    listed = run(policy_site, url, "--json", "runs", cwd=tmp_path, future=True)
    assert [(r["run_id"], r["status"]) for r in json.loads(listed.stdout)] == [(run_id, "running")]
    write(tmp_path, "replay.py", REPLAY)
    api = run(policy_site, url, "replay.py", url, run_id, cwd=tmp_path, future=True)
    assert api.stdout.strip() == "running [('a', 'succeeded'), ('b', 'ready')]", api.stderr

    write(tmp_path, "handlers.py", HANDLERS)
    resumed = run(policy_site, url, "resume", run_id, "--handlers", "handlers.py", cwd=tmp_path, future=True)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert "run succeeded" in resumed.stdout


PROJECT = """
import sys
from mayfly.inspect import build_inspection
from mayfly.local import LocalWorkflowJournal
from mayfly.recovery import inspect_run
from mayfly.telemetry import compute_metrics, project_pal

journal = LocalWorkflowJournal(sys.argv[1])
records = journal.read(sys.argv[2])
upcasters = {("NodeReady", 1): lambda body: {"type": "NodeReady", "node_id": body["node"], "cause": body["cause"]}}
recovered = inspect_run(journal, sys.argv[2], upcasters=upcasters)  # recovery takes them explicitly
print(build_inspection(recovered, records).history.lines[1])
print([fact.event_type for fact in project_pal(records)][1])
print(compute_metrics([recovered], {sys.argv[2]: records}).runs_observed)
"""


def test_projections_read_records_through_the_installed_upcasters_by_default(
    tmp_path: Path, policy_site: Path
) -> None:
    """build_inspection, project_pal and compute_metrics decode v1 records through the installed plugin."""
    url = f"file://{tmp_path}/journal"
    run_id = v1_fixture(url)
    write(tmp_path, "project.py", PROJECT)
    done = run(policy_site, url, "project.py", url, run_id, cwd=tmp_path, future=True)
    assert done.stdout.splitlines() == ["#2 NodeReady a ready (initial)", "NodeReady", "1"], done.stderr
    bare = run(None, url, "project.py", url, run_id, cwd=tmp_path, future=True)
    assert bare.returncode == 1 and "no upcaster registered for NodeReady v1 -> v2" in bare.stderr


def test_mayfly_cancel_reads_through_the_installed_upcaster(tmp_path: Path, policy_site: Path) -> None:
    """`mayfly cancel` of a v1 history works with the plugin installed and fails closed without it."""
    url = f"file://{tmp_path}/journal"
    run_id = v1_fixture(url)
    bare = run(None, url, "cancel", run_id, "--reason", "old", cwd=tmp_path, future=True)
    assert bare.returncode == 5 and "no upcaster registered for NodeReady v1 -> v2" in bare.stderr
    done = run(policy_site, url, "cancel", run_id, "--reason", "old", cwd=tmp_path, future=True)
    assert (done.returncode, done.stdout.strip()) == (0, f"run {run_id}: cancelled"), done.stderr


def test_two_plugins_declaring_one_upcaster_key_fail_loudly(tmp_path: Path, clashing_site: Path) -> None:
    """With both plugins installed, every read refuses, naming both plugins: neither silently wins."""
    url = f"file://{tmp_path}/journal"
    run_id = v1_fixture(url)
    for args in (("replay", run_id), ("inspect", run_id), ("runs",)):
        refused = run(clashing_site, url, *args, cwd=tmp_path, future=True)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        assert refused.stderr.count("\n") == 1 and CLASH in refused.stderr
    write(tmp_path, "replay.py", REPLAY)
    api = run(clashing_site, url, "replay.py", url, run_id, cwd=tmp_path, future=True)
    assert api.returncode == 1 and f"mayfly.model.errors.PluginError: {CLASH}" in api.stderr
