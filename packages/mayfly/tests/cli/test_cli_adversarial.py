"""The mayfly command's error paths and filters, driven the way users break them."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mayfly.cli import main
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal

HANDLERS = """
import os
import signal
import sys
import time
from mayfly import HandlerRegistry, Succeeded
from mayfly.model.signals import SignalToken
from mayfly.runtime import WaitForSignal

registry = HandlerRegistry()
TOKEN = "adversarial-cli-token-0123456789"

@registry.handler("gate")
def gate(req):
    if req.signal is None:
        return WaitForSignal("go", SignalToken(TOKEN))
    return Succeeded(output=req.signal.decision)

@registry.handler("ok")
def ok(req):
    return Succeeded(output=1)

@registry.handler("bye")
def bye(req):
    sys.exit(0)

@registry.handler("slowgate")
def slowgate(req):
    if req.signal is None:
        return WaitForSignal("go", SignalToken(TOKEN))
    with open(os.environ["ADV_LOG"], "a") as log:
        log.write(f"{req.attempt_id} {os.getpid()}\\n")
    time.sleep(1.5)
    return Succeeded(output=req.signal.decision)
"""
TOKEN = "adversarial-cli-token-0123456789"


class Cli:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = f"file://{root}/journal?durability=write"
        (root / "handlers.py").write_text(HANDLERS)

    def spec(self, handler: str, name: str = "spec.json") -> str:
        path = self.root / name
        nodes = [{"id": "a", "handler": handler}]
        path.write_text(json.dumps({"workflow_id": f"adv.{handler[:-2]}", "version": 1, "nodes": nodes}))
        return str(path)

    def __call__(self, *args: str, code: int = 0) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = main(["--journal", self.journal, *args], out=out, err=err)
        assert rc == code, (rc, out.getvalue(), err.getvalue())
        if code not in (0, 1, 6):
            assert err.getvalue().count("\n") == 1
            if "--json" in args:
                assert json.loads(err.getvalue())["exit"] == code
            else:
                assert err.getvalue().startswith("mayfly: error: ")
        return out.getvalue(), err.getvalue()

    def parked(self) -> str:
        out, _ = self(
            "--json", "run", self.spec("gate@1"), "--handlers", str(self.root / "handlers.py"), code=6
        )
        run_id: str = json.loads(out)["run_id"]
        return run_id


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def test_runs_state_waiting_lists_the_runs_parked_on_a_signal(cli: Cli) -> None:
    """`mayfly runs --state waiting` lists a parked run, and `--state succeeded` does not."""
    run_id = cli.parked()
    out, _ = cli("--json", "runs", "--state", "waiting")
    assert [row["run_id"] for row in json.loads(out)] == [run_id]
    out, _ = cli("--json", "runs", "--state", "succeeded")
    assert json.loads(out) == []


def test_runs_refuses_a_negative_limit(cli: Cli) -> None:
    """`mayfly runs --limit -1` is a usage error, not an empty listing."""
    _, err = cli("runs", "--limit", "-1", code=2)
    assert "argument --limit: must be >= 0, got -1" in err


@pytest.mark.parametrize("word", ["no", "fine", "tomorrow", "nack", "2nd-look"])
def test_signal_accepts_any_word_as_a_decision(cli: Cli, word: str) -> None:
    """A one-word decision is recorded as a word even when it starts like JSON (t, f, n, a digit)."""
    run_id = cli.parked()
    out, _ = cli("--json", "signal", run_id, "a", "--token", TOKEN, "--decision", word, "--by", "ada")
    assert json.loads(out)["status"] == "accepted"
    out, _ = cli("--json", "resume", run_id, "--handlers", str(cli.root / "handlers.py"))
    assert json.loads(out)["outputs"]["a"] == {"decision": word, "by": "ada"}


def test_signal_decisions_that_are_json_stay_json(cli: Cli) -> None:
    """`true`, numbers and objects are decoded as JSON; broken JSON is a one-line usage error."""
    run_id = cli.parked()
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", '{"verdict": ', code=2)
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", "true")
    out, _ = cli("--json", "resume", run_id, "--handlers", str(cli.root / "handlers.py"))
    assert json.loads(out)["outputs"]["a"] is True


def test_deeply_nested_json_arguments_are_usage_errors(cli: Cli) -> None:
    """`--input` or `--decision` nested past the parser's depth gives one line and exit 2, not a traceback."""
    deep = "[" * 5000 + "]" * 5000
    cli("run", cli.spec("ok@1"), "--handlers", str(cli.root / "handlers.py"), "--input", deep, code=2)
    run_id = cli.parked()
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", deep, code=2)


def test_an_oversized_run_input_is_a_usage_error(cli: Cli) -> None:
    """A run input over the inline limit is refused with exit 2 (bad input), nothing written."""
    _, err = cli(
        "run",
        cli.spec("ok@1"),
        "--handlers",
        str(cli.root / "handlers.py"),
        "--input",
        '"' + "x" * 70_000 + '"',
        code=2,
    )
    assert "65536" in err
    _, err = cli("--json", "runs", code=5)  # nothing was written: not even a journal
    assert "no journal at" in json.loads(err)["error"]


def test_every_command_prints_valid_json(cli: Cli) -> None:
    """With --json, run, runs, inspect, replay, signal, resume, cancel and backends each print one JSON document."""
    handlers = str(cli.root / "handlers.py")
    run_id = cli.parked()
    outputs = [
        cli("--json", "runs")[0],
        cli("--json", "inspect", run_id)[0],
        cli("--json", "replay", run_id)[0],
        cli("--json", "signal", run_id, "a", "--token", TOKEN, "--decision", "approve")[0],
        cli("--json", "resume", run_id, "--handlers", handlers)[0],
        cli("--json", "backends")[0],
    ]
    other = cli.parked()
    outputs.append(cli("--json", "cancel", other, "--reason", "adversarial")[0])
    for text in outputs:
        json.loads(text)


def test_a_handler_calling_sys_exit_does_not_end_the_command_as_a_success(tmp_path: Path) -> None:
    """`sys.exit(0)` inside a handler stops `mayfly run` with exit 130 and one line naming the resumable run."""
    cli = Cli(tmp_path)
    env = {**os.environ, "MAYFLY_JOURNAL": cli.journal}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mayfly",
            "run",
            cli.spec("bye@1"),
            "--handlers",
            str(tmp_path / "handlers.py"),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 130, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "SystemExit(0)" in result.stderr
    # The printed command names the handlers module too: without it the resume would be refused.
    run_id = json.loads(cli("--json", "runs")[0])[0]["run_id"]
    assert f"resume {run_id} --handlers {tmp_path / 'handlers.py'}`" in result.stderr
    out, _ = cli("--json", "runs", "--state", "running")
    assert len(json.loads(out)) == 1


def test_runs_lists_the_other_runs_when_one_history_is_unreadable(cli: Cli) -> None:
    """A run whose history this Mayfly cannot read shows as `unreadable` instead of failing the whole listing."""
    run_id = cli.parked()
    foreign = Uuid7IdSource().new_id()
    record = JournalRecord.seal(
        run_id=foreign,
        sequence=1,
        event_id=Uuid7IdSource().new_id(),
        event_type="FromTheFuture",
        schema_version=1,
        payload=b"{}",
    )
    LocalWorkflowJournal(cli.journal).append(foreign, 1, [record], None)
    out, _ = cli("--json", "runs")
    rows = {row["run_id"]: row for row in json.loads(out)}
    assert rows[run_id]["status"] == "waiting"
    assert rows[foreign]["status"] == "unreadable" and "FromTheFuture" in rows[foreign]["error"]
    text, _ = cli("runs")
    assert "unreadable" in text
    out, _ = cli("--json", "runs", "--state", "waiting")
    assert [row["run_id"] for row in json.loads(out)] == [run_id]
    cli("inspect", foreign, code=5)


def test_resume_of_an_owned_run_prints_no_recovery_plan(cli: Cli) -> None:
    """`mayfly resume` on a run another process owns exits 4 without claiming to re-invoke anything."""
    handlers = str(cli.root / "handlers.py")
    run_id = cli.parked()
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", "approve")
    with LocalLeaseStore(cli.journal).acquire(run_id, "someone-else", 60_000):
        out, err = cli("resume", run_id, "--handlers", handlers, code=4)
    assert "recovery:" not in out and "another process owns it" in err
    out, _ = cli("resume", run_id, "--handlers", handlers)
    assert "recovery: re-invoking a attempt 1 under its original id" in out


def test_two_processes_racing_to_resume_one_run_drive_it_once(tmp_path: Path) -> None:
    """Two `mayfly resume` processes started together: one drives, the other exits 4 or finds it done; one invocation."""
    cli = Cli(tmp_path)
    handlers = str(tmp_path / "handlers.py")
    out, _ = cli("--json", "run", cli.spec("slowgate@1"), "--handlers", handlers, code=6)
    run_id = json.loads(out)["run_id"]
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", "approve")
    log = tmp_path / "invocations.log"
    env = {**os.environ, "MAYFLY_JOURNAL": cli.journal, "ADV_LOG": str(log)}
    command = [sys.executable, "-m", "mayfly", "resume", run_id, "--handlers", handlers]
    racers = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in racers]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 4]), results
    for code, err in results:
        assert "Traceback" not in err
        if code == 4:
            assert err.count("\n") == 1 and "another process owns it" in err
    assert len(log.read_text().splitlines()) == 1
    out, _ = cli("--json", "inspect", run_id)
    assert json.loads(out)["status"] == "succeeded"


def test_run_timeline_goes_to_the_output_stream_it_was_given(cli: Cli) -> None:
    """`mayfly run --timeline` writes its timeline to main's `out`, like every other line of the command."""
    out, _ = cli("run", cli.spec("ok@1"), "--handlers", str(cli.root / "handlers.py"), "--timeline")
    assert "a          succeeded" in out and "run succeeded" in out


def test_an_unusable_demo_pause_neither_breaks_the_command_nor_the_demo(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad `MAYFLY_DEMO_PAUSE` (not a number, negative) leaves every command and the demo working."""
    env = {**os.environ, "MAYFLY_DEMO_PAUSE": "abc", "MAYFLY_JOURNAL": cli.journal}
    backends = subprocess.run(  # a fresh process, because `import mayfly` loads the demo plugin
        [sys.executable, "-m", "mayfly", "backends"], check=False, capture_output=True, text=True, env=env
    )
    assert backends.returncode == 0 and "Traceback" not in backends.stderr, backends.stderr
    monkeypatch.setenv("MAYFLY_DEMO_PAUSE", "-1")
    out, _ = cli("--json", "demo", "--auto-approve")
    assert json.loads(out)["status"] == "succeeded"


def test_a_handlers_module_that_republishes_plugin_handlers_or_fails_to_register_is_handled(cli: Cli) -> None:
    """A module re-registering the demo's own handlers runs; one whose register() raises is one usage line."""
    (cli.root / "demo_handlers.py").write_text(
        "from mayfly import HandlerRegistry\n"
        "from mayfly.demo import register_demo_handlers\n"
        "from mayfly.model.outcomes import Succeeded\n"
        "registry = HandlerRegistry()\n"
        "register_demo_handlers(registry)\n"
        "registry.register('ok', 1, lambda req: Succeeded())\n"
    )
    out, _ = cli("--json", "run", cli.spec("ok@1"), "--handlers", str(cli.root / "demo_handlers.py"))
    assert json.loads(out)["status"] == "succeeded"
    (cli.root / "broken.py").write_text("def register(registry):\n    raise RuntimeError('db down')\n")
    _, err = cli("run", cli.spec("ok@1"), "--handlers", str(cli.root / "broken.py"), code=2)
    assert "RuntimeError: db down" in err


def test_inspect_refuses_json_together_with_mermaid(cli: Cli) -> None:
    """`inspect --json --mermaid` is a usage error rather than Mermaid text where JSON was asked for."""
    run_id = cli.parked()
    _, err = cli("--json", "inspect", run_id, "--mermaid", code=2)
    assert "exclusive" in err


def test_a_handlers_file_with_postponed_annotations_and_dataclasses_loads(cli: Cli) -> None:
    """A `--handlers file.py` using `from __future__ import annotations` with dataclasses/Structs imports fine."""
    (cli.root / "typed_handlers.py").write_text(
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "import msgspec\n"
        "from mayfly import HandlerRegistry, Succeeded\n"
        "@dataclasses.dataclass\n"
        "class Config:\n"
        "    name: str\n"
        "    retries: dataclasses.InitVar[int] = 0\n"
        "class Report(msgspec.Struct):\n"
        "    name: str\n"
        "registry = HandlerRegistry()\n"
        "registry.register('ok', 1, lambda req: Succeeded(output=msgspec.to_builtins(Report(Config('x').name))))\n"
    )
    out, _ = cli("--json", "run", cli.spec("ok@1"), "--handlers", str(cli.root / "typed_handlers.py"))
    assert json.loads(out)["outputs"] == {"a": {"name": "x"}}


@pytest.mark.parametrize("value", ["NaN", "[Infinity]", '{"x": -Infinity}', "1e999"])
def test_non_finite_numbers_in_json_arguments_are_usage_errors(cli: Cli, value: str) -> None:
    """NaN and infinities in --input or --decision are refused: the journal's JSON would turn them into null."""
    handlers = str(cli.root / "handlers.py")
    cli("run", cli.spec("ok@1"), "--handlers", handlers, "--input", value, code=2)
    cli("--json", "runs", code=5)  # no journal was created
    run_id = cli.parked()
    cli("signal", run_id, "a", "--token", TOKEN, "--decision", value, code=2)


def test_demo_crash_in_json_mode_still_names_the_run_to_resume(tmp_path: Path) -> None:
    """`mayfly --json demo --crash-at plan` dies before any JSON, so it names the run on stderr beforehand."""
    cli = Cli(tmp_path)
    env = {**os.environ, "MAYFLY_JOURNAL": cli.journal, "MAYFLY_DEMO_PAUSE": "0"}
    crashed = subprocess.run(
        [sys.executable, "-m", "mayfly", "--json", "demo", "--crash-at", "plan"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert crashed.returncode == -signal.SIGKILL and crashed.stdout == ""
    run_id = json.loads(cli("--json", "runs")[0])[0]["run_id"]
    assert f"resume {run_id}" in crashed.stderr


@pytest.mark.parametrize("depth", [1_000, 995, 200])
def test_a_spec_nested_too_deeply_is_a_usage_error_that_creates_nothing(cli: Cli, depth: int) -> None:
    """A spec whose node input nests ~1,000 levels (or past the 128-level limit) gives one line, exit 2, no store."""
    path = cli.root / "deep.json"
    deep = "[" * depth + "]" * depth
    path.write_text(
        f'{{"workflow_id": "adv.deep", "version": 1, "nodes": [{{"id": "a", "handler": "ok@1", "input": {deep}}}]}}'
    )
    _, err = cli("run", str(path), "--handlers", str(cli.root / "handlers.py"), code=2)
    assert "nested too deeply" in err or "nesting is 200 levels" in err
    assert not (cli.root / "journal").exists()


def test_integers_too_long_for_json_are_usage_errors_that_change_nothing(cli: Cli) -> None:
    """An integer of more than 4,300 digits in --input or --decision gives one line and exit 2."""
    handlers = str(cli.root / "handlers.py")
    long = "9" * 5_000
    for text in (long, f"[{long}]", f'{{"n": -{long}}}'):
        _, err = cli("run", cli.spec("ok@1"), "--handlers", handlers, "--input", text, code=2)
        assert "an integer of 5000 digits is over the limit of 4300 digits" in err
    assert not (cli.root / "journal").exists()
    run_id = cli.parked()
    with LocalWorkflowJournal(cli.journal) as journal:
        before = journal.read(run_id)
        _, err = cli("signal", run_id, "a", "--token", TOKEN, "--decision", long, code=2)
        assert err == (
            "mayfly: error: --decision: an integer of 5000 digits is over the limit of 4300 digits; "
            "pass it as a string\n"
        )
        assert journal.read(run_id) == before


def test_a_double_dash_as_a_json_argument_is_a_usage_error(cli: Cli) -> None:
    """`--input=--` and `--decision=--` (which Python 3.11's argparse hands over as an empty list, not "--") are
    one usage line each, and write nothing."""
    _, err = cli("run", cli.spec("ok@1"), "--handlers", str(cli.root / "handlers.py"), "--input=--", code=2)
    assert err == "mayfly: error: --input is not valid JSON: got '--'\n"
    run_id = cli.parked()
    _, err = cli("signal", run_id, "a", "--token", TOKEN, "--decision=--", code=2)
    assert err == "mayfly: error: --decision is not valid JSON: got '--'\n"
