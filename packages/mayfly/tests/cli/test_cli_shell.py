"""The mayfly command as a shell user meets it: run as a subprocess, from a venv that is not on PATH."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mayfly.local import LocalLeaseStore

RUN_ID = re.compile(r"run ([0-9a-f-]{36})")
VENV_BIN = Path(sys.executable).absolute().parent
# PATH as after the README's install without activating the venv: the venv's bin is not on it.
BARE_PATH = os.pathsep.join(
    p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and Path(p).absolute() != VENV_BIN
)


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "MAYFLY_JOURNAL")}
    env.update(MAYFLY_DEMO_PAUSE="0", PATH=BARE_PATH, MAYFLY_JOURNAL=f"file://{tmp_path}/journal")
    env.update(extra)
    return env


def run(
    tmp_path: Path, *args: str, code: int | None = 0, argv: list[str] | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mayfly ARGS`` (or ``argv`` verbatim) in ``tmp_path``; check the exit code."""
    command = argv if argv is not None else [sys.executable, "-m", "mayfly", *args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environment(tmp_path, **extra),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    if code is not None:
        assert result.returncode == code, (command, result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def parked_demo(tmp_path: Path) -> str:
    """A demo run parked on its approval; its id."""
    result = run(tmp_path, "demo", code=6)
    return RUN_ID.search(result.stdout).group(1)  # type: ignore[union-attr]


def printed(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found is not None, text
    return found.group(1)


# -- commands the CLI prints run as printed ------------------------------------------------------


def test_printed_commands_run_verbatim_from_a_venv_that_is_not_on_path(tmp_path: Path) -> None:
    """`python -m mayfly` prints its interpreter path; each printed command, split by shlex, runs as is."""
    crashed = run(tmp_path, "demo", "--crash-at", "review", code=-9)
    resume = printed(r"continue afterwards with:\n  ([^\n]+)", crashed.stdout)
    assert shlex.split(resume)[:3] == [sys.executable, "-m", "mayfly"]
    resumed = run(tmp_path, argv=shlex.split(resume), code=6)
    signal = printed(r"Approve it with:\n  ([^\n]+)", resumed.stderr)
    then = printed(r"then continue it with:\n  ([^\n]+)", resumed.stderr)
    assert "accepted" in run(tmp_path, argv=shlex.split(signal)).stdout
    assert "run succeeded" in run(tmp_path, argv=shlex.split(then)).stdout


def test_the_installed_script_run_by_path_prints_its_own_path(tmp_path: Path) -> None:
    """`.venv/bin/mayfly` off PATH prints commands starting with that path, and they work verbatim."""
    script = VENV_BIN / "mayfly"
    if not script.exists():
        pytest.skip("the mayfly console script is not installed beside this interpreter")
    parked = run(tmp_path, argv=[str(script), "demo"], code=6)
    signal = printed(r"Approve it with:\n  ([^\n]+)", parked.stderr)
    assert shlex.split(signal)[0] == str(script)
    assert "accepted" in run(tmp_path, argv=shlex.split(signal)).stdout


def test_a_mayfly_on_path_that_is_this_one_is_printed_bare(tmp_path: Path) -> None:
    """With the venv's bin on PATH, the printed commands start with a bare `mayfly`."""
    if not (VENV_BIN / "mayfly").exists():
        pytest.skip("the mayfly console script is not installed beside this interpreter")
    parked = run(tmp_path, "demo", code=6, PATH=f"{VENV_BIN}{os.pathsep}{BARE_PATH}")
    assert printed(r"Approve it with:\n  ([^\n]+)", parked.stderr).startswith("mayfly --journal ")


# -- read-only commands never create a journal ---------------------------------------------------

READ_ONLY = [
    ["runs"],
    ["inspect", "01a2"],
    ["replay", "01a2"],
    ["signal", "01a2", "approval", "--token", "x" * 20, "--decision", "approve"],
    ["cancel", "01a2", "--reason", "typo"],
    ["resume", "01a2", "--handlers", "mayfly.demo"],
    ["result", "01a2"],
    ["watch", "01a2"],
    ["index", "rebuild"],
]


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: c[0])
def test_read_only_commands_refuse_a_missing_journal_and_create_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    """A mistyped --journal is exit 5 naming the URL; neither it nor the default ./.mayfly is created."""
    root = Path(f"/nonexistent-root-dir-{uuid.uuid4().hex}")
    url = f"file://{root}/x/y"
    result = run(tmp_path, "--journal", url, *command, code=5)
    assert result.stderr.startswith(f"mayfly: error: no journal at {url};")
    assert result.stderr.count("\n") == 1
    assert not root.exists()
    default = run(tmp_path, *command, code=5, MAYFLY_JOURNAL="")
    assert "no journal at file://./.mayfly" in default.stderr
    assert not (tmp_path / ".mayfly").exists() and not (tmp_path / "journal").exists()


# -- run-id prefixes ------------------------------------------------------------------------------


def test_a_unique_run_id_prefix_works_everywhere_and_an_ambiguous_one_lists_the_matches(
    tmp_path: Path,
) -> None:
    """A prefix (also as the docs write it, `01a2…`) names one run; a shared prefix is exit 2 listing both."""
    first, second = parked_demo(tmp_path), parked_demo(tmp_path)
    shared = next(first[:i] for i in range(len(first)) if first[i] != second[i])
    ambiguous = run(tmp_path, "inspect", shared, code=2)
    assert "matches several runs" in ambiguous.stderr and first in ambiguous.stderr
    assert second in ambiguous.stderr and ambiguous.stderr.count("\n") == 1
    prefix = first[: len(shared) + 1]
    assert f"run          {first}" in run(tmp_path, "inspect", prefix).stdout
    assert f"run          {first}" in run(tmp_path, "inspect", prefix + "…").stdout
    assert f"run {first}: waiting" in run(tmp_path, "result", prefix, code=6).stdout
    assert f"run {first}" in run(tmp_path, "replay", prefix).stdout
    assert f"run {first}: waiting" in run(tmp_path, "watch", prefix, code=6).stdout
    assert (
        f"run {first}: waiting" in run(tmp_path, "resume", prefix, "--handlers", "mayfly.demo", code=6).stdout
    )
    assert "rejected" in run(tmp_path, "signal", prefix, "approval", "--token", "x" * 20,
                             "--decision", "approve", code=2).stdout  # fmt: skip
    assert f"run {second}: cancelled" in run(tmp_path, "cancel", second[: len(shared) + 1],
                                             "--reason", "r").stdout  # fmt: skip
    missing = run(tmp_path, "inspect", "fff", code=3)
    assert "run fff… not found" in missing.stderr


# -- watch ------------------------------------------------------------------------------------------


def test_watch_follows_a_run_live_until_it_parks_and_exits_with_result_codes(tmp_path: Path) -> None:
    """`mayfly watch RUN` prints facts as another process commits them, then exits 6 when the run parks."""
    env = environment(tmp_path, MAYFLY_DEMO_PAUSE="0.25")
    demo = subprocess.Popen(
        [sys.executable, "-m", "mayfly", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert demo.stdout is not None
        run_id = RUN_ID.search(demo.stdout.readline()).group(1)  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while run(tmp_path, "result", run_id, code=None).returncode == 3:
            assert time.monotonic() < deadline, "the demo never created its run"
            time.sleep(0.05)
        watched = run(tmp_path, "watch", run_id, "--interval", "0.05", code=6)
        assert demo.wait(timeout=60) == 6
    finally:
        demo.kill()
        demo.wait()
    lines = watched.stdout.splitlines()
    assert any(
        re.fullmatch(r"  #\d+\s+review     changes_requested: tests missing.*", line) for line in lines
    )
    assert any("approval   waiting for signal 'approval'" in line for line in lines)
    told = lines.index(f"run {run_id}: waiting")
    assert lines[-1] == "  waiting: node approval for signal 'approval'" and told < len(lines) - 1
    # A finished run is told whole and ends at once with its result code.
    run(tmp_path, "signal", run_id, "approval", "--token", "x" * 20, "--decision", "approve", code=2)
    cancelled = run(tmp_path, "cancel", run_id, "--reason", "seen enough")
    assert "cancelled" in cancelled.stdout
    done = run(tmp_path, "watch", run_id, code=1)
    assert "run cancellation requested by" in done.stdout and f"run {run_id}: cancelled\n" in done.stdout


def test_watch_of_a_run_nobody_drives_gives_up_at_its_timeout(tmp_path: Path) -> None:
    """A crashed run stays running: `watch --timeout` exits 124 after telling its facts."""
    crashed = run(tmp_path, "demo", "--crash-at", "plan", code=-9)
    run_id = RUN_ID.search(crashed.stdout).group(1)  # type: ignore[union-attr]
    watched = run(tmp_path, "watch", run_id, "--timeout", "0.5", code=124)
    assert "plan       started attempt 1" in watched.stdout
    assert "neither ended nor parked within 0.5 s" in watched.stderr


# -- words, times and tables -------------------------------------------------------------------------


def test_a_parked_run_is_waiting_in_inspect_and_resume_too(tmp_path: Path) -> None:
    """`runs`, `result`, `inspect`, `replay` and `resume` all call a run parked on a signal `waiting`."""
    run_id = parked_demo(tmp_path)
    assert re.search(rf"{run_id}\s+\S+\s+waiting", run(tmp_path, "runs").stdout)
    assert f"run {run_id}: waiting" in run(tmp_path, "result", run_id, code=6).stdout
    assert re.search(r"^status\s+waiting ", run(tmp_path, "inspect", run_id).stdout, re.M)
    assert "; status waiting; snapshot agrees" in run(tmp_path, "replay", run_id).stdout
    resumed = run(tmp_path, "resume", run_id, "--handlers", "mayfly.demo", code=6)
    assert f"run {run_id}: waiting" in resumed.stdout and ": running" not in resumed.stdout


def test_inspect_tells_wall_times_and_durations_beside_virtual_milliseconds(tmp_path: Path) -> None:
    """Deadlines read `in 6d 23h`, blocking reasons carry UTC wall times, the last fact `… ago`."""
    run_id = parked_demo(tmp_path)
    table = run(tmp_path, "inspect", run_id).stdout
    assert re.search(r"^last fact\s+\d{4}-\d\d-\d\dT[\d:.]+Z \((\d+ ms|\d+s|now)( ago)?\)", table, re.M)
    approval = next(line for line in table.splitlines() if line.startswith("approval "))
    assert re.search(r"\d+ ms, in (6d 23h|7d)", approval), approval
    blocking = table.split("BLOCKING", 1)[1]
    assert re.search(r"expires at \d+ ms \(\d{4}-\d\d-\d\dT[\d:.]+Z, in (6d 23h|7d)\)", blocking), blocking
    assert "(in 604800000 ms)" not in table


def test_inspect_tables_have_headers_and_legends_and_a_short_history_keeps_attempt_numbers(
    tmp_path: Path,
) -> None:
    """Every section has a header row, the ATTEMPT column a legend; `--history 2` still numbers attempts."""
    run_id = parked_demo(tmp_path)
    table = run(tmp_path, "inspect", run_id, "--history", "2").stdout
    assert "ATTEMPT: this activation's attempt / attempts over the whole run" in table
    assert re.search(r"^NODE\s+WHY IT IS NOT DONE$", table, re.M)
    assert re.search(r"^ATTEMPT ID\s+NODE\s+ATTEMPT\s+OUTCOME", table, re.M)
    rows = [line.split() for line in table.split("ATTEMPTS", 1)[1].splitlines() if "  qa  " in line]
    assert [row[2] for row in rows] == ["1", "2"]
    # The demo writes 29 events, or 30 when time advances once more on a slow machine.
    found = re.search(r"HISTORY \(complete (\d+), retained 2, omitted (\d+)\)", table)
    assert found is not None and int(found[1]) in (29, 30) and int(found[2]) == int(found[1]) - 2, table
    assert f"the first {found[2]} events are left out; `--history N` keeps more" in table


# -- refusals, ids, errors -----------------------------------------------------------------------------


def test_a_lease_held_refusal_names_the_holder_and_when_it_lets_go(tmp_path: Path) -> None:
    """Exit 4 says who holds the lease (owner, pid, token) and that file leases last until release or exit."""
    run_id = parked_demo(tmp_path)
    with LocalLeaseStore(f"file://{tmp_path}/journal").acquire(run_id, "ops-console", 60_000) as lease:
        refused = run(tmp_path, "cancel", run_id, "--reason", "x", code=4)
        token = lease.fencing_token
    assert f"held by ops-console (pid {os.getpid()}, token {token})" in refused.stderr
    assert "do not expire: it is held until that process releases it or exits" in refused.stderr
    assert refused.stderr.count("\n") == 1


def test_signal_id_accepts_an_id_the_user_chooses_and_stays_idempotent(tmp_path: Path) -> None:
    """`--signal-id deploy-42` is accepted (mapped to a UUID), and the same id again is already consumed."""
    parked = json.loads(run(tmp_path, "--json", "demo", code=6).stdout)
    run_id, token = parked["run_id"], parked["approval"]["token"]
    args = (
        "signal",
        run_id,
        "approval",
        "--token",
        token,
        "--decision",
        "approve",
        "--signal-id",
        "deploy-42",
    )
    first = run(tmp_path, *args)
    assert re.match(r"signal deploy-42 \([0-9a-f-]{36}\) to approval: accepted", first.stdout)
    again = json.loads(run(tmp_path, "--json", *args).stdout)
    assert again["status"] == "already_consumed" and again["chosen_id"] == "deploy-42"
    assert again["signal_id"] in first.stdout
    bad = run(tmp_path, *args[:-1], "two words", code=2)
    assert "--signal-id 'two words'" in bad.stderr


def test_errors_are_json_on_stderr_in_json_mode(tmp_path: Path) -> None:
    """With --json, a command error and an argument error are each one JSON line with the exit code."""
    missing = json.loads(run(tmp_path, "runs", "--json", code=5).stderr)
    assert missing["exit"] == 5 and missing["error"].startswith("no journal at ")
    parked_demo(tmp_path)
    refused = run(tmp_path, "--json", "inspect", "zz", code=2)
    assert refused.stdout == ""
    document = json.loads(refused.stderr)
    assert document["exit"] == 2 and "run 'zz'" in document["error"]
    arguments = json.loads(run(tmp_path, "--json", "runs", "--limit", "x", code=2).stderr)
    assert arguments["exit"] == 2 and "--limit" in arguments["error"]


def test_quiet_leaves_out_the_hints_on_stderr(tmp_path: Path) -> None:
    """`--quiet` keeps results on stdout and drops the what-to-run-next hints from stderr."""
    loud = run(tmp_path, "demo", code=6)
    assert "Approve it with:" in loud.stderr
    quiet = run(tmp_path, "--quiet", "demo", code=6)
    assert quiet.stderr == "" and "run parked durably" not in quiet.stderr
    assert RUN_ID.search(quiet.stdout)
    submitted = run(tmp_path, "submit", "-q", str(write_spec(tmp_path)))
    assert submitted.stderr == "" and re.fullmatch(r"[0-9a-f-]{36}\n", submitted.stdout)


def write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps({"workflow_id": "cli.q", "version": 1, "nodes": [{"id": "a", "handler": "a@1"}]})
    )
    return path


def on_a_terminal(tmp_path: Path, *args: str, **extra: str) -> str:
    """Standard output of ``mayfly ARGS`` run on a pseudo-terminal."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "mayfly", *args],
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env=environment(tmp_path, TERM="xterm", **extra),
            cwd=tmp_path,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=60) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path: Path) -> None:
    """Status words are coloured on a TTY; NO_COLOR and a pipe get plain text."""
    parked_demo(tmp_path)
    assert "\x1b[33mwaiting" in on_a_terminal(tmp_path, "runs")
    assert "\x1b[" not in on_a_terminal(tmp_path, "runs", NO_COLOR="1")
    assert "\x1b[" not in run(tmp_path, "runs").stdout


@pytest.mark.parametrize(
    "command", [["backends"], ["runs"], ["--help"], ["inspect", "RUN"], ["watch", "RUN"]]
)
def test_a_closed_pipe_never_prints_a_traceback(tmp_path: Path, command: list[str]) -> None:
    """`mayfly ... | head -1` and a reader that never reads end quietly, with nothing on stderr."""
    run_id = parked_demo(tmp_path)
    words = " ".join(shlex.quote(run_id if w == "RUN" else w) for w in command)
    for reader in ("head -1", "true"):
        line = f"{shlex.quote(sys.executable)} -m mayfly {words} 2>err.txt | {reader}"
        subprocess.run(["sh", "-c", line], env=environment(tmp_path), cwd=tmp_path, timeout=60, check=True)
        err = (tmp_path / "err.txt").read_text()
        assert "Traceback" not in err and "Error" not in err and "error" not in err, (line, err)


def test_help_is_plain_text_and_argument_errors_are_one_line(tmp_path: Path) -> None:
    """--help has no reStructuredText; a bad argument or command is one `mayfly: error:` line, exit 2."""
    helped = run(tmp_path, "--help").stdout
    assert "exit codes:" in helped and "  124  " in helped
    assert "====" not in helped and "``" not in helped
    for args, expected in (
        (["runs", "--limit", "x"], "argument --limit: expected a whole number"),
        (["frob"], "argument COMMAND: invalid choice: 'frob'"),
        (["signal", "01a2"], "the following arguments are required"),
    ):
        result = run(tmp_path, *args, code=2)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("mayfly: error: "), result.stderr
        assert expected in result.stderr and "--help`" in result.stderr and result.stdout == ""


def test_crash_at_errors_list_the_valid_nodes(tmp_path: Path) -> None:
    """An unknown --crash-at node is refused naming every node the demo can crash at."""
    refused = run(tmp_path, "demo", "--crash-at", "deploy", code=2)
    assert "choose one of plan, implement, review, qa, publish" in refused.stderr
    assert not (tmp_path / "journal").exists()


def test_demo_json_carries_the_approval_token_and_the_command_that_uses_it(tmp_path: Path) -> None:
    """`--json demo` parks with an `approval` object: its token, and a signal command that works verbatim."""
    document = json.loads(run(tmp_path, "--json", "demo", code=6).stdout)
    approval = document["approval"]
    assert document["waiting"] == {"approval": "approval"} and len(approval["token"]) >= 16
    assert f"--token {approval['token']}" in approval["signal"]
    assert "accepted" in run(tmp_path, argv=shlex.split(approval["signal"])).stdout
    assert "run succeeded" in run(tmp_path, argv=shlex.split(approval["resume"])).stdout


# -- the reference pages say what the command does ---------------------------------------------------

DOCS = Path(__file__).resolve().parents[4] / "docs"


def test_cli_md_names_the_real_flags_of_every_command(tmp_path: Path) -> None:
    """Each command's row in docs/cli.md names each of its flags, and no flag it does not have."""
    from mayfly.cli import build_parser

    parser = build_parser()
    common = {o for action in parser._actions for o in action.option_strings}
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = {}
    for line in (DOCS / "cli.md").read_text().splitlines():
        found = re.match(r"\| `mayfly (\w+)", line)
        if found:
            rows[found.group(1)] = line
    assert set(rows) == set(commands.choices)
    for name, command in commands.choices.items():
        own = {o for action in command._actions for o in action.option_strings if o.startswith("--")}
        # A row may mention another command's flag as part of that command (`mayfly run --timeline`).
        row = re.sub(rf"`mayfly (?!{name}\b)[^`]*`", "", rows[name])
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", row))
        assert own - common - {"--help"} <= named, (name, own - common - named)
        assert named <= own | common, (name, named - own - common)
    # The flags the issue found missing are the real command's: its help says so.
    signal = run(tmp_path, "signal", "--help").stdout
    assert all(flag in signal for flag in ("--by BY", "--name NAME", "--signal-id SIGNAL_ID", "--wait S"))
    assert "--requester REQUESTER" in run(tmp_path, "cancel", "--help").stdout


ROUTED = """
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()

@registry.handler("check")
def check(req):
    return Succeeded(output={"verdict": "ok"})

@registry.handler("ship")
def ship(req):
    return Succeeded(output={"shipped": True})
"""


def test_an_edge_predicate_written_as_transitions_md_shows_it_runs(tmp_path: Path) -> None:
    """`{"type": "field", ...}` (as docs/transitions.md writes it) routes; the old `"match"` key is refused."""
    (tmp_path / "routed.py").write_text(ROUTED)

    def spec(when: dict[str, object]) -> str:
        document = {
            "workflow_id": "cli.routed",
            "version": 1,
            "nodes": [{"id": "check", "handler": "check@1"}, {"id": "ship", "handler": "ship@1"}],
            "edges": [{"source": "check", "target": "ship", "when": when}],
        }
        path = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*')))}.json"
        path.write_text(json.dumps(document))
        return str(path)

    documented = spec({"type": "field", "field": "verdict", "equals": "ok"})
    shipped = json.loads(run(tmp_path, "--json", "run", documented, "--handlers", "routed.py").stdout)
    assert shipped["status"] == "succeeded" and shipped["outputs"]["ship"] == {"shipped": True}
    old = spec({"match": "field", "field": "verdict", "equals": "ok"})
    refused = run(tmp_path, "run", old, "--handlers", "routed.py", code=2)
    assert refused.stderr.startswith("mayfly: error: specification ") and "edges[0].when" in refused.stderr
