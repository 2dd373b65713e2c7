"""`mayfly schedule` as a user runs it: add, list, show, remove; bad input is one line and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mayfly.model.spec import WorkflowSpec
from mayfly.schedules import tick_run_id

SPEC = {"workflow_id": "sched.cli", "version": 2, "nodes": [{"id": "n", "handler": "tick@1"}]}


def mayfly(
    tmp_path: Path, *args: str, code: int = 0, journal: str | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "mayfly", "--journal", journal or f"file://{tmp_path}/store", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    return str(path)


def test_add_list_show_remove_in_text_and_json(tmp_path: Path, spec: str) -> None:
    """What add stores, list and show print (text and JSON, the spec whole); remove forgets it."""
    added = mayfly(
        tmp_path, "schedule", "add", "nightly", spec, "--cron", "30 2 * * *", "--input", '{"a": [1]}'
    )
    assert added.stdout.startswith(
        "schedule nightly added: cron 30 2 * * *, workflow sched.cli@2 on queue default"
    )
    assert "schedule list" in added.stderr  # the hint names what to run next
    row = json.loads(
        mayfly(
            tmp_path, "--json", "schedule", "add", "tick", spec, "--every", "1h30m", "--offset", "5m",
            "--queue", "reports", "--catch-up", "all",
        ).stdout
    )  # fmt: skip
    assert (row["name"], row["every_ms"], row["offset_ms"], row["when"]) == (
        "tick",
        5_400_000,
        300_000,
        "every 90m +5m",
    )
    assert (row["queue"], row["catch_up"], row["version"], row["last_tick_ms"]) == ("reports", "all", 1, None)
    assert row["next_run_id"] == tick_run_id("tick", row["next_tick_ms"])
    table = mayfly(tmp_path, "schedule", "list").stdout.splitlines()
    assert table[0].split() == [
        "SCHEDULE",
        "WHEN",
        "WORKFLOW",
        "QUEUE",
        "CATCH-UP",
        "VERSION",
        "LAST",
        "TICK",
        "NEXT",
        "TICK",
    ]
    assert [line.split()[0] for line in table[1:]] == ["nightly", "tick"]
    listed = json.loads(mayfly(tmp_path, "--json", "schedule", "list").stdout)
    assert [(r["name"], r["input"]) for r in listed] == [("nightly", {"a": [1]}), ("tick", None)]
    shown = json.loads(mayfly(tmp_path, "--json", "schedule", "show", "nightly").stdout)
    assert WorkflowSpec.from_json(json.dumps(shown["spec"])) == WorkflowSpec.from_json(json.dumps(SPEC))
    assert shown["cron"] == "30 2 * * *"
    text = mayfly(tmp_path, "schedule", "show", "nightly").stdout
    assert 'input      {"a": [1]}' in text and "next tick  " in text
    replaced = mayfly(tmp_path, "schedule", "add", "nightly", spec, "--every", "2s", "--replace").stdout
    assert "replaced (version 2)" in replaced
    assert "removed" in mayfly(tmp_path, "schedule", "remove", "nightly").stdout
    assert "nothing removed" in mayfly(tmp_path, "schedule", "remove", "nightly").stdout
    assert json.loads(mayfly(tmp_path, "--json", "schedule", "remove", "tick").stdout) == {
        "name": "tick",
        "removed": True,
    }
    assert json.loads(mayfly(tmp_path, "--json", "schedule", "list").stdout) == []
    assert "no schedules" in mayfly(tmp_path, "schedule", "list").stdout


def test_bad_input_is_a_one_line_error_that_changes_nothing(tmp_path: Path, spec: str) -> None:
    """Usage errors exit 2, a taken name 7, an unknown one 3; the stored schedule stays as it was."""
    mayfly(tmp_path, "schedule", "add", "keep", spec, "--every", "2s")
    stored = ("version", "updated_ms", "every_ms", "spec", "input")

    def kept() -> list[object]:
        shown = json.loads(mayfly(tmp_path, "--json", "schedule", "show", "keep").stdout)
        return [shown[field] for field in stored]

    before = kept()
    (tmp_path / "bad.json").write_text('{"workflow_id": "x"}')
    for args in (
        ("schedule", "add", "keep2", spec),  # neither --every nor --cron
        ("schedule", "add", "keep2", spec, "--every", "2s", "--cron", "* * * * *"),
        ("schedule", "add", "keep2", spec, "--every", "two seconds"),
        ("schedule", "add", "keep2", spec, "--every", "500ms"),  # below the 1 s minimum
        ("schedule", "add", "keep2", spec, "--cron", "61 * * * *"),
        ("schedule", "add", "keep2", spec, "--cron", "0 0 31 2 *"),  # never fires
        ("schedule", "add", "keep2", spec, "--cron", "* * * * *", "--offset", "1s"),
        ("schedule", "add", "Bad Name", spec, "--every", "2s"),
        ("schedule", "add", "keep2", str(tmp_path / "bad.json"), "--every", "2s"),
        ("schedule", "add", "keep2", str(tmp_path / "missing.json"), "--every", "2s"),
        ("schedule", "add", "keep2", spec, "--every", "2s", "--input", "{oops"),
        ("schedule", "add", "keep2", spec, "--every", "2s", "--queue", "Not A Queue"),
        ("schedule", "add", "keep2", spec, "--every", "2s", "--catch-up", "sometimes"),
        ("schedule", "add", "keep", spec, "--every", "5s"),  # taken: exit 7 below
        ("schedule", "show"),
        ("schedule", "list", "keep"),
        ("schedule", "remove", "keep", "--every", "2s"),
    ):
        code = 7 if args[2:3] == ("keep",) and args[1] == "add" else 2
        done = mayfly(tmp_path, *args, code=code)
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("mayfly: error: "), done.stderr
    taken = json.loads(
        mayfly(tmp_path, "--json", "schedule", "add", "keep", spec, "--every", "5s", code=7).stderr
    )
    assert taken["exit"] == 7 and "exists already" in taken["error"] and "--replace" in taken["error"]
    assert mayfly(tmp_path, "schedule", "show", "nope", code=3).stderr.startswith(
        "mayfly: error: no schedule nope"
    )
    assert kept() == before
    assert [r["name"] for r in json.loads(mayfly(tmp_path, "--json", "schedule", "list").stdout)] == ["keep"]


def test_reading_never_creates_a_journal(tmp_path: Path) -> None:
    """list, show and remove on a journal that does not exist exit 5 and create nothing."""
    for args in (("schedule", "list"), ("schedule", "show", "x"), ("schedule", "remove", "x")):
        assert "no journal at" in mayfly(tmp_path, *args, code=5).stderr
    assert not (tmp_path / "store").exists()


PLUGIN = '''
"""A file journal that does not declare schedule_store."""

import msgspec

from mayfly.backend import backend_hooks
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal

MAYFLY_PLUGIN_API = 1


class NoSchedules(LocalWorkflowJournal):
    def __init__(self, url):
        super().__init__("file://" + url.split("://", 1)[1])
        self._capabilities = msgspec.structs.replace(self._capabilities, schedule_store=False)


def leases(url):
    return LocalLeaseStore("file://" + url.split("://", 1)[1])


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(("nosched",), "noschedprobe", NoSchedules, leases)
'''


def test_a_journal_without_the_feature_is_refused_by_name(tmp_path: Path, spec: str) -> None:
    """A backend that does not declare schedule_store: exit 2, naming the feature and what to do."""
    site = tmp_path / "site"
    (site / "noschedprobe-0.dist-info").mkdir(parents=True)
    (site / "noschedprobe.py").write_text(textwrap.dedent(PLUGIN))
    (site / "noschedprobe-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: noschedprobe\nVersion: 0\n"
    )
    (site / "noschedprobe-0.dist-info" / "entry_points.txt").write_text(
        "[mayfly]\nnoschedprobe = noschedprobe\n"
    )
    url = f"nosched://{tmp_path}/store"
    done = mayfly(tmp_path, "schedule", "add", "x", spec, "--every", "2s", journal=url, code=2)
    assert "does not declare schedule_store" in done.stderr and "in code" in done.stderr
    assert (
        "does not declare schedule_store" in mayfly(tmp_path, "schedule", "list", journal=url, code=2).stderr
    )
    assert not (tmp_path / "store" / "schedules").exists()
