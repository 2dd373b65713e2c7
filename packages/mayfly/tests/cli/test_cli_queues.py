"""`mayfly queue` as a user runs it: set, show, list and remove a queue's flow control; bad input changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def mayfly(tmp_path: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "mayfly", "--journal", f"file://{tmp_path}/store", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


def test_set_changes_only_what_it_names_and_list_show_remove_report_it(tmp_path: Path) -> None:
    """Settings accumulate across `set`s, `unlimited` lifts one, `--reset` starts over; JSON says the same."""
    table = mayfly(tmp_path, "queue", "set", "emails", "--concurrency", "5", "--rate", "100/1m").stdout
    assert table.splitlines()[0].split() == [
        "QUEUE", "CONCURRENCY", "PER", "WORKER", "RATE", "ORDER", "IN", "PROGRESS", "STARTS", "IN", "WINDOW",
    ]  # fmt: skip
    assert table.splitlines()[1].split() == ["emails", "5", "-", "100/1m", "fifo", "0", "0"]
    mayfly(tmp_path, "queue", "set", "emails", "--worker-concurrency", "2", "--priority")
    shown = json.loads(mayfly(tmp_path, "--json", "queue", "show", "emails").stdout)
    assert (shown["concurrency"], shown["worker_concurrency"], shown["rate"], shown["priority"]) == (
        5,
        2,
        "100/1m",
        True,
    )
    mayfly(tmp_path, "queue", "set", "emails", "--concurrency", "unlimited", "--no-priority")
    shown = json.loads(mayfly(tmp_path, "--json", "queue", "show", "emails").stdout)
    assert (shown["concurrency"], shown["worker_concurrency"], shown["priority"]) == (None, 2, False)
    mayfly(tmp_path, "queue", "set", "emails", "--reset", "--concurrency", "1")
    listed = json.loads(mayfly(tmp_path, "--json", "queue", "list").stdout)
    assert [(q["name"], q["concurrency"], q["worker_concurrency"], q["rate"]) for q in listed] == [
        ("emails", 1, None, None)
    ]
    assert "limits removed" in mayfly(tmp_path, "queue", "remove", "emails").stdout
    assert "had no limits" in mayfly(tmp_path, "queue", "remove", "emails").stdout
    assert json.loads(mayfly(tmp_path, "--json", "queue", "list").stdout) == []
    assert "no queue has limits" in mayfly(tmp_path, "queue", "list").stdout


def test_bad_settings_are_one_line_usage_errors_that_change_nothing(tmp_path: Path) -> None:
    """A bad rate, limit, name or a missing NAME exits 2 with one line; the stored settings stay as they were."""
    mayfly(tmp_path, "queue", "set", "jobs", "--concurrency", "3")
    for args in (
        ("queue", "set", "jobs", "--rate", "ten/s"),
        ("queue", "set", "jobs", "--rate", "10/fortnight"),
        ("queue", "set", "jobs", "--concurrency", "0"),
        ("queue", "set", "Bad Name", "--concurrency", "1"),
        ("queue", "set"),
        ("queue", "show", "jobs", "--concurrency", "2"),
    ):
        refused = mayfly(tmp_path, *args, code=2)
        assert refused.stderr.startswith("mayfly: error: ") and refused.stderr.count("\n") == 1, (
            refused.stderr
        )
    shown = json.loads(mayfly(tmp_path, "--json", "queue", "show", "jobs").stdout)
    assert shown["concurrency"] == 3


def test_reading_queues_never_creates_a_journal(tmp_path: Path) -> None:
    """`queue list` and `show` on a missing journal exit 5 and create nothing; `set` creates it, like submit."""
    refused = mayfly(tmp_path, "queue", "list", code=5)
    assert "no journal at" in refused.stderr
    assert not (tmp_path / "store").exists()
    mayfly(tmp_path, "queue", "show", "x", code=5)
    assert not (tmp_path / "store").exists()
    mayfly(tmp_path, "queue", "set", "x", "--concurrency", "1")
    assert (tmp_path / "store").exists()
