"""The mayfly command, run as a subprocess exactly as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from mayfly.local import LocalLeaseStore

RUN_ID = re.compile(r"run ([0-9a-f-]{36})")


def mayfly(tmp_path: Path, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAYFLY_DEMO_PAUSE": "0", "MAYFLY_JOURNAL": f"file://{tmp_path}/journal"}
    result = subprocess.run(
        [sys.executable, "-m", "mayfly", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    if check is not None:
        assert result.returncode == check, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def command_arguments(printed: str) -> list[str]:
    """The arguments after the program in a command line the CLI printed (`mayfly ...` or `PYTHON -m mayfly ...`)."""
    words = shlex.split(printed)
    if words[0] == "mayfly" or Path(words[0]).name == "mayfly":
        return words[1:]
    assert words[1:3] == ["-m", "mayfly"], printed
    return words[3:]


def test_demo_with_auto_approve_succeeds_and_shows_the_timeline(tmp_path: Path) -> None:
    """`mayfly demo --auto-approve` runs every stage and ends with a succeeded inspection."""
    result = mayfly(tmp_path, "demo", "--auto-approve")
    out = result.stdout
    for line in (
        "review     changes_requested: tests missing for the jitter path",
        "implement  activated by review (edge 1)",
        "qa         retry 2 scheduled in 400 ms",
        "approval   waiting for signal 'approval'",
        "run succeeded",
    ):
        assert line in out
    assert re.search(r"status\s+succeeded \(terminal\)", out)


def test_demo_json_reports_the_result(tmp_path: Path) -> None:
    """`--json` prints the run result as one JSON document."""
    result = mayfly(tmp_path, "--json", "demo", "--auto-approve")
    data = json.loads(result.stdout)
    assert data["status"] == "succeeded"
    assert data["outputs"]["publish"]["published"] == "v1.2.0"


def test_crash_resume_signal_resume_and_inspect(tmp_path: Path) -> None:
    """A SIGKILLed demo resumes under the original attempt id, parks, is approved and finishes."""
    crashed = mayfly(tmp_path, "demo", "--crash-at", "review", check=None)
    assert crashed.returncode == -signal.SIGKILL
    run_id = RUN_ID.search(crashed.stdout).group(1)  # type: ignore[union-attr]
    started = re.search(r"review     started attempt 1", crashed.stdout)
    assert started is not None

    listed = json.loads(mayfly(tmp_path, "--json", "runs").stdout)
    assert [r["status"] for r in listed if r["run_id"] == run_id] == ["running"]

    # The demo is not a plugin: a resume that names no handlers module is refused, writing nothing.
    refused = mayfly(tmp_path, "resume", run_id, check=2)
    assert "demo.review@1 -> node review" in refused.stderr and "nothing was written" in refused.stderr
    printed = re.search(r"continue afterwards with:\n  ([^\n]+)", crashed.stdout)
    assert printed is not None and printed.group(1).endswith(f" resume {run_id} --handlers mayfly.demo")
    resumed = mayfly(tmp_path, *command_arguments(printed.group(1)), check=6)
    assert "re-invoking review attempt 1 under its original id" in resumed.stdout
    token = re.search(r"--token (\S+)", resumed.stderr).group(1)  # type: ignore[union-attr]
    then = re.search(r"then continue it with:\n  ([^\n]+)", resumed.stderr)
    assert then is not None and then.group(1) == printed.group(1)

    rejected = mayfly(
        tmp_path, "signal", run_id, "approval", "--token", "x" * 20, "--decision", "approve", check=2
    )
    assert "rejected (token_mismatch)" in rejected.stdout
    signal_id = "01a22ba1-0000-7000-8000-000000000abc"
    accepted = mayfly(
        tmp_path,
        "signal",
        run_id,
        "approval",
        "--token",
        token,
        "--decision",
        "approve",
        "--signal-id",
        signal_id,
    )
    assert "accepted" in accepted.stdout
    again = mayfly(
        tmp_path,
        "signal",
        run_id,
        "approval",
        "--token",
        token,
        "--decision",
        "approve",
        "--signal-id",
        signal_id,
    )
    assert "already_consumed" in again.stdout

    finished = mayfly(tmp_path, *command_arguments(then.group(1)))
    assert "run succeeded" in finished.stdout

    inspection = mayfly(tmp_path, "--json", "inspect", run_id).stdout
    assert json.loads(inspection)["status"] == "succeeded"
    table = mayfly(tmp_path, "inspect", run_id).stdout
    mermaid = mayfly(tmp_path, "inspect", run_id, "--mermaid").stdout
    assert mermaid.startswith("flowchart TD")
    # Never handler input or output bodies, never the raw token.
    for text in (inspection, table, mermaid):
        for secret in (token, "MAY-42", "diff_sha", "v1.2.0", "approved_by"):
            assert secret not in text
    replayed = mayfly(tmp_path, "replay", run_id)
    assert "snapshot agrees" in replayed.stdout
    assert [
        r["run_id"] for r in json.loads(mayfly(tmp_path, "--json", "runs", "--state", "succeeded").stdout)
    ] == [run_id]


HANDLERS = """
from mayfly import HandlerRegistry, Succeeded, PermanentFailure

registry = HandlerRegistry()

@registry.handler("greet")
def greet(req):
    return Succeeded(output={"hello": req.run_input["name"]})

@registry.handler("fail")
def fail(req):
    return PermanentFailure(reason="nope")
"""


def write_spec(tmp_path: Path, handler: str) -> Path:
    spec = {"workflow_id": "cli.test", "version": 1, "nodes": [{"id": "a", "handler": handler}]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    (tmp_path / "handlers.py").write_text(HANDLERS)
    return path


def test_run_a_spec_file_with_a_handlers_module(tmp_path: Path) -> None:
    """`mayfly run SPEC --handlers FILE --input JSON` executes and exits 0 on success, 1 on failure."""
    spec = write_spec(tmp_path, "greet@1")
    ok = mayfly(
        tmp_path, "--json", "run", str(spec), "--handlers", "handlers.py", "--input", '{"name": "ada"}'
    )
    assert json.loads(ok.stdout)["outputs"] == {"a": {"hello": "ada"}}
    spec = write_spec(tmp_path, "fail@1")
    failed = mayfly(tmp_path, "run", str(spec), "--handlers", "handlers.py", check=1)
    assert "failed" in failed.stdout and "nope" in failed.stdout


def test_cancel_a_parked_run(tmp_path: Path) -> None:
    """`mayfly cancel` records the cancellation of a run no process owns; a second cancel is refused."""
    parked = mayfly(tmp_path, "demo", check=6)
    run_id = RUN_ID.search(parked.stdout).group(1)  # type: ignore[union-attr]
    done = mayfly(tmp_path, "cancel", run_id, "--reason", "not this week")
    assert "cancelled" in done.stdout
    again = mayfly(tmp_path, "cancel", run_id, "--reason", "again", check=2)
    assert again.stderr.startswith("mayfly: error: run_terminal")


def test_user_errors_are_one_line_with_documented_exit_codes(tmp_path: Path) -> None:
    """Bad ids, missing runs, owned runs and unknown backends give one line and their exit code."""
    no_journal = mayfly(tmp_path, "inspect", "01a22ba1-0000-7000-8000-000000000001", check=5)
    scheme = mayfly(tmp_path, "--journal", "nosuch://x", "runs", check=2)
    parked = mayfly(tmp_path, "demo", check=6)
    run_id = RUN_ID.search(parked.stdout).group(1)  # type: ignore[union-attr]
    bad = mayfly(tmp_path, "inspect", "nope", check=2)
    missing = mayfly(tmp_path, "inspect", "01a22ba1-0000-7000-8000-000000000001", check=3)
    for result in (no_journal, bad, missing, scheme):
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("mayfly: error: ")
    with LocalLeaseStore(f"file://{tmp_path}/journal").acquire(run_id, "someone-else", 60_000):
        owned = mayfly(tmp_path, "cancel", run_id, "--reason", "x", check=4)
    assert "another process owns it" in owned.stderr


def test_help_and_backends(tmp_path: Path) -> None:
    """--help documents the exit codes; `backends` lists the built-in file:// journal."""
    assert "130" in mayfly(tmp_path, "--help").stdout
    assert "file://" in mayfly(tmp_path, "backends").stdout


STOPS_ONCE = """
import pathlib
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()
MARK = pathlib.Path(__file__).with_name("stopped-once")

@registry.handler("publish", version=2)
def publish(req):
    if not MARK.exists():
        MARK.write_text(req.attempt_id)
        raise SystemExit(3)  # the user's own workflow stops the process mid-attempt
    return Succeeded(output={"attempt": req.attempt_id})
"""


def test_resume_without_the_handlers_is_refused_and_the_printed_resume_command_continues(
    tmp_path: Path,
) -> None:
    """A stopped user workflow: `resume` without --handlers exits 2 writing nothing; the printed command works."""
    spec = {"workflow_id": "cli.stop", "version": 1, "nodes": [{"id": "ship", "handler": "publish@2"}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "stops.py").write_text(STOPS_ONCE)
    stopped = mayfly(tmp_path, "run", "spec.json", "--handlers", "stops.py", check=130)
    printed = re.search(r"continue it with `([^`]+)`", stopped.stderr)
    assert printed is not None and printed.group(1).endswith("--handlers stops.py")
    run_id = RUN_ID.search(stopped.stderr).group(1)  # type: ignore[union-attr]
    before = json.loads(mayfly(tmp_path, "--json", "inspect", run_id).stdout)["sequence"]

    refused = mayfly(tmp_path, "resume", run_id, check=2)
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("mayfly: error: resume refused: ")
    assert "publish@2 -> node ship" in refused.stderr and "nothing was written" in refused.stderr
    assert "no --handlers module was given" in refused.stderr and "--handlers MODULE" in refused.stderr
    after = json.loads(mayfly(tmp_path, "--json", "inspect", run_id).stdout)
    assert (after["sequence"], after["status"]) == (before, "running")

    continued = mayfly(tmp_path, *command_arguments(printed.group(1)))
    assert "re-invoking ship attempt 1 under its original id" in continued.stdout
    assert "run succeeded" in continued.stdout


def test_the_demo_handlers_are_in_no_users_registry(tmp_path: Path) -> None:
    """A user's run that names a demo handler is refused: the demo is not a plugin, so nothing serves it."""
    node = {"id": "a", "handler": "demo.plan@1", "input": {"ticket": "T-1"}}
    spec = {"workflow_id": "cli.demo", "version": 1, "nodes": [node]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "handlers.py").write_text(HANDLERS)
    refused = mayfly(tmp_path, "run", "spec.json", "--handlers", "handlers.py", check=2)
    assert "demo.plan@1" in refused.stderr
    served = mayfly(tmp_path, "--json", "run", "spec.json", "--handlers", "mayfly.demo")
    assert json.loads(served.stdout)["outputs"]["a"]["ticket"] == "T-1"
