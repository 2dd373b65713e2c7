"""Opening a file store's run index from many processes at once: each opens, none dies of a busy lock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mayfly.identity import Uuid7IdSource
from mayfly.local import LocalWorkflowJournal
from mayfly.runindex import IndexEntry, IndexStatus

IDS = Uuid7IdSource()
OPENERS = 8

# An opener: waits for the start file, opens the store's index (index_get does), and prints "ok".
_OPENER = """
import os, sys, time
from mayfly.local import LocalWorkflowJournal
url, start = sys.argv[1], sys.argv[2]
while not os.path.exists(start):
    time.sleep(0.001)
with LocalWorkflowJournal(url) as journal:
    journal.index_get("0190a8a0-0000-7000-8000-000000000000")
print("ok", flush=True)
"""


def _open_together(
    url: str, start: Path, then: Callable[[], None] = lambda: None
) -> list[subprocess.CompletedProcess[str]]:
    """Start OPENERS processes, let them open ``url`` at once, call ``then``, and collect them."""
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(OPENERS)
    ]
    time.sleep(0.5)  # let them all reach the start line
    start.touch()
    then()
    results = []
    for opener in openers:
        out, err = opener.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(opener.args, opener.returncode, out, err))
    return results


def test_processes_opening_a_new_index_at_once_all_open_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}?durability=write"
    with LocalWorkflowJournal(url):
        pass  # lays out the store; the index itself is created by the first opener
    for result in _open_together(url, tmp_path / "go"):
        assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


def test_openers_wait_for_a_writer_holding_the_index_and_keep_its_rows(tmp_path: Path) -> None:
    store = tmp_path / "store"
    url = f"file://{store}?durability=write"
    run_id = IDS.new_id()
    with LocalWorkflowJournal(url) as journal:
        journal.index_get(run_id)  # creates the index
    writer = sqlite3.connect(store / "index.sqlite3", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(
        "INSERT INTO runs (run_id, queue, status, ready_at, sequence) VALUES (?, 'work', 'new', 5, 3)",
        (run_id,),
    )

    def commit_a_second_later() -> None:
        time.sleep(1.0)
        writer.execute("COMMIT")
        writer.close()

    # The writer holds the write lock while the openers start; it commits a second after they do.
    for result in _open_together(url, tmp_path / "go", commit_a_second_later):
        assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
    with LocalWorkflowJournal(url) as journal:
        assert journal.index_get(run_id) == IndexEntry(
            run_id=run_id, queue="work", status=IndexStatus.NEW, ready_at_ms=5, sequence=3
        )
