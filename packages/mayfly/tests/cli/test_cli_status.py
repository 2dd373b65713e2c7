"""One status word everywhere: a parked run is `waiting` in every command, in text and in JSON (subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from test_cli_shell import environment, run

FLAKY = """
from mayfly import HandlerRegistry, RetryableFailure

registry = HandlerRegistry()

@registry.handler("flaky")
def flaky(req):
    return RetryableFailure(reason="upstream down")
"""

WEEK_MS = 7 * 24 * 3600 * 1000


def backoff_parked(tmp_path: Path) -> str:
    """A run a worker parked on a week-long retry backoff, the worker stopped; its id."""
    spec = {
        "workflow_id": "cli.backoff",
        "version": 1,
        "nodes": [
            {
                "id": "fetch",
                "handler": "flaky@1",
                "retry": {"max_attempts": 3, "backoff": {"type": "fixed", "delay_ms": WEEK_MS}},
            }
        ],
    }
    (tmp_path / "backoff.json").write_text(json.dumps(spec))
    (tmp_path / "flaky.py").write_text(FLAKY)
    run_id = run(tmp_path, "-q", "submit", "backoff.json").stdout.strip()
    worker = subprocess.Popen(
        [sys.executable, "-m", "mayfly", "worker", "--handlers", "flaky.py", "--poll-interval", "50"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(tmp_path),
        cwd=tmp_path,
    )
    try:
        assert worker.stderr is not None
        for line in worker.stderr:  # the worker logs each park; it ends its stderr only when it stops
            if f"run {run_id} parked on a timer" in line:
                break
        else:
            raise AssertionError("the worker stopped without parking the run")
        worker.terminate()
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        worker.wait()
    return run_id


def assert_waiting_everywhere(
    tmp_path: Path, run_id: str, *, handlers: str
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every command that shows the run calls it `waiting`, in text and in --json; their text runs."""
    shown: dict[str, subprocess.CompletedProcess[str]] = {}
    listing = run(tmp_path, "runs").stdout
    assert re.search(rf"^{run_id}\s+\S+\s+waiting\s", listing, re.M), listing
    (row,) = json.loads(run(tmp_path, "--json", "runs", "--state", "waiting").stdout)
    assert (row["run_id"], row["status"]) == (run_id, "waiting")

    shown["inspect"] = run(tmp_path, "inspect", run_id)
    assert re.search(r"^status\s+waiting \(", shown["inspect"].stdout, re.M), shown["inspect"].stdout
    inspected = json.loads(run(tmp_path, "inspect", run_id, "--json").stdout)
    assert (inspected["status"], inspected["result"], inspected["schema_version"]) == ("waiting", None, 2)

    for command in (["result", run_id], ["resume", run_id, "--handlers", handlers], ["watch", run_id]):
        shown[command[0]] = told = run(tmp_path, *command, code=6)
        assert f"run {run_id}: waiting\n" in told.stdout and ": running" not in told.stdout, (command, told)
        lines = run(tmp_path, "--json", *command, code=6).stdout.splitlines()
        document = json.loads(lines[-1])  # watch prints its facts first, one JSON line each
        assert (document["run_id"], document["status"]) == (run_id, "waiting"), command

    assert "; status waiting; snapshot agrees" in run(tmp_path, "replay", run_id).stdout
    shown["replay --json"] = replayed = run(tmp_path, "--json", "replay", run_id)
    assert json.loads(replayed.stdout)["status"] == "waiting"
    return shown


def test_a_run_parked_on_a_signal_is_waiting_in_every_command_text_and_json(tmp_path: Path) -> None:
    """The demo parked on its approval: runs, inspect, result, resume, watch, replay, demo itself say waiting."""
    parked = json.loads(run(tmp_path, "--json", "demo", code=6).stdout)
    assert parked["status"] == "waiting" and parked["waiting"] == {"approval": "approval"}
    shown = assert_waiting_everywhere(tmp_path, parked["run_id"], handlers="mayfly.demo")
    assert "  waiting: node approval for signal 'approval'" in shown["result"].stdout
    assert "approval (signal approval)" in shown["inspect"].stdout
    waited = json.loads(run(tmp_path, "--json", "result", parked["run_id"], "--wait", code=6).stdout)
    assert waited["status"] == "waiting"


def test_a_run_parked_on_a_long_backoff_is_waiting_in_every_command_text_and_json(tmp_path: Path) -> None:
    """A worker parked the run on a week-long retry: every command says waiting and when it wakes."""
    run_id = backoff_parked(tmp_path)
    # 6 or 7: a worker that picked the run up a second or more after its submission recorded the time.
    left = json.loads(run(tmp_path, "--json", "replay", run_id).stdout)["events"]
    assert left in (6, 7)
    shown = assert_waiting_everywhere(tmp_path, run_id, handlers="flaky.py")
    wakes = r"  waiting: node fetch to retry \(attempt 2\) at \d{4}-\d\d-\d\dT[\d:.]+Z \(in (6d 23h|7d)\)\n"
    for command in ("result", "resume", "watch"):
        assert re.search(wakes, shown[command].stdout), (command, shown[command].stdout)
    assert "fetch (retry)" in shown["inspect"].stdout
    # resume leaves it parked, as the worker did (it would only sleep a week holding it), and says so.
    hint = shown["resume"].stderr
    assert "only waits for a timer, due at " in hint and " worker --handlers MODULE" in hint
    assert json.loads(shown["replay --json"].stdout)["events"] == left  # as the worker left it
