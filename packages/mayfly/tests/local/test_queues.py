"""Queue flow control of the file journal across processes: killed claimants, old index files, dedup ids."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mayfly.errors import DuplicateRun
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.queues import QueueSettings, QueueUsage
from mayfly.runindex import IndexEntry, IndexStatus

IDS = Uuid7IdSource()
TTL_MS = 60_000

# A claimant process: claims from QUEUE, prints what it got, then holds it until stdin closes or it dies.
_CLAIMANT = """
import json, sys, time
from mayfly.local import LocalWorkflowJournal
url, queue = sys.argv[1], sys.argv[2]
journal = LocalWorkflowJournal(url)
guards = journal.claim("child", limit=10, ttl_ms=60000, now_ms=time.time_ns() // 1000000, queues=[queue])
print(json.dumps([guard.run_id for guard in guards]), flush=True)
sys.stdin.readline()
"""


def _now() -> int:
    return time.time_ns() // 1_000_000


def _record(run_id: str, sequence: int) -> JournalRecord:
    return JournalRecord.seal(
        run_id=run_id,
        sequence=sequence,
        event_id=IDS.new_id(),
        event_type="Tested",
        schema_version=1,
        payload=b"{}",
    )


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store?durability=write"


@pytest.fixture
def journal(url: str) -> Iterator[LocalWorkflowJournal]:
    with LocalWorkflowJournal(url) as opened:
        yield opened


def _queued(journal: LocalWorkflowJournal, queue: str, count: int) -> list[str]:
    now = _now()
    entries = [
        IndexEntry(
            run_id=IDS.new_id(), queue=queue, status=IndexStatus.NEW, ready_at_ms=now - count + n, sequence=1
        )
        for n in range(count)
    ]
    journal.index_put(entries)
    return [entry.run_id for entry in entries]


def test_a_sigkilled_claimants_slots_are_freed_and_the_limit_still_holds(
    url: str, journal: LocalWorkflowJournal
) -> None:
    """Concurrency 2: a child holds 2 (no more for us); SIGKILLed, its 2 slots are ours, and still no third."""
    journal.queue_set(QueueSettings(name="work", concurrency=2))
    runs = _queued(journal, "work", 5)
    child = subprocess.Popen(
        [sys.executable, "-c", _CLAIMANT, url, "work"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        held = json.loads(child.stdout.readline())
        assert held == runs[:2]
        assert journal.claim("parent", limit=10, ttl_ms=TTL_MS, now_ms=_now(), queues=["work"]) == []
        assert journal.queue_usage("work", now_ms=_now()).in_progress == 2
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait(timeout=30)
    guards = journal.claim("parent", limit=10, ttl_ms=TTL_MS, now_ms=_now(), queues=["work"])
    try:
        assert [guard.run_id for guard in guards] == runs[:2], "the dead claimant's runs are claimable again"
        assert journal.claim("parent", limit=10, ttl_ms=TTL_MS, now_ms=_now(), queues=["work"]) == []
        assert journal.queue_usage("work", now_ms=_now()).in_progress == 2
    finally:
        for guard in guards:
            guard.release()
    assert journal.queue_usage("work", now_ms=_now()).in_progress == 0


_VERSION_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    run_id   TEXT PRIMARY KEY,
    queue    TEXT NOT NULL,
    status   TEXT NOT NULL,
    ready_at INTEGER,
    sequence INTEGER NOT NULL,
    wake     INTEGER NOT NULL DEFAULT 0,
    parent   TEXT,
    priority INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX runs_claim ON runs (status, ready_at) WHERE parent IS NULL;
INSERT INTO meta (key, value) VALUES ('schema_version', '1');
"""


def test_an_index_file_from_before_queues_is_upgraded_in_place(tmp_path: Path) -> None:
    """A schema-1 index keeps its entries, gains queues, dedup ids and starts, and says version 2."""
    store = tmp_path / "store"
    with LocalWorkflowJournal(f"file://{store}?durability=write"):
        pass  # lays out the store (the index itself is created on first use)
    old = IDS.new_id()
    database = sqlite3.connect(store / "index.sqlite3")
    database.executescript(_VERSION_1)
    database.execute(
        "INSERT INTO runs (run_id, queue, status, ready_at, sequence) VALUES (?, 'work', 'new', 5, 3)", (old,)
    )
    database.commit()
    database.close()
    with LocalWorkflowJournal(f"file://{store}?durability=write") as journal:
        assert journal.index_get(old) == IndexEntry(
            run_id=old, queue="work", status=IndexStatus.NEW, ready_at_ms=5, sequence=3
        )
        journal.queue_set(QueueSettings(name="work", rate_limit=5, rate_period_ms=60_000))
        now = _now()
        [guard] = journal.claim("w", limit=5, ttl_ms=TTL_MS, now_ms=now, queues=["work"])
        guard.release()
        entry = journal.index_get(old)
        assert entry is not None and entry.started_ms == now
        assert journal.queue_usage("work", now_ms=now) == QueueUsage(in_progress=0, recent_starts=1)
    database = sqlite3.connect(store / "index.sqlite3")
    try:
        (version,) = database.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        database.close()
    assert version == "2"
    with LocalWorkflowJournal(f"file://{store}?durability=write") as journal:
        assert journal.queue_get("work") == QueueSettings(name="work", rate_limit=5, rate_period_ms=60_000)


def _create(journal: LocalWorkflowJournal, run_id: str, dedup: str) -> None:
    entry = IndexEntry(
        run_id=run_id, queue="orders", status=IndexStatus.NEW, ready_at_ms=_now(), sequence=1, dedup_id=dedup
    )
    journal.append_indexed(run_id, 1, [_record(run_id, 1)], None, lambda: entry)


# Another process tries to create a run with a dedup id; prints the live run it was refused for, or "created".
_DUPLICATE = """
import sys
from mayfly.errors import DuplicateRun
from mayfly.journal import JournalRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.runindex import IndexEntry, IndexStatus
url, run_id, event_id, dedup = sys.argv[1:5]
record = JournalRecord.seal(
    run_id=run_id, sequence=1, event_id=event_id, event_type="Tested", schema_version=1, payload=b"{}"
)
entry = IndexEntry(run_id=run_id, queue="orders", status=IndexStatus.NEW, ready_at_ms=1, sequence=1, dedup_id=dedup)
with LocalWorkflowJournal(url) as journal:
    try:
        journal.append_indexed(run_id, 1, [record], None, lambda: entry)
    except DuplicateRun as refused:
        print(refused.live_run_id)
    else:
        print("created")
"""


def test_a_dedup_id_is_refused_in_every_process_until_its_run_ends(
    url: str, journal: LocalWorkflowJournal
) -> None:
    """A live run's dedup id refuses a second run here and in another process, writing nothing; freed at its end."""
    first, second, third = IDS.new_id(), IDS.new_id(), IDS.new_id()
    _create(journal, first, "order-7")
    with pytest.raises(DuplicateRun) as refused:
        _create(journal, second, "order-7")
    assert refused.value.live_run_id == first
    assert journal.next_sequence(second) == 1
    assert journal.index_get(second) is None
    elsewhere = subprocess.run(
        [sys.executable, "-c", _DUPLICATE, url, third, IDS.new_id(), "order-7"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert elsewhere.stdout.strip() == first
    assert journal.next_sequence(third) == 1
    ended = IndexEntry(
        run_id=first,
        queue="orders",
        status=IndexStatus.TERMINAL,
        ready_at_ms=None,
        sequence=2,
        dedup_id="order-7",
    )
    journal.append_indexed(first, 2, [_record(first, 2)], None, lambda: ended)
    again = subprocess.run(
        [sys.executable, "-c", _DUPLICATE, url, third, IDS.new_id(), "order-7"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert again.stdout.strip() == "created"
    stored = journal.index_get(third)
    assert stored is not None and stored.dedup_id == "order-7"
    with pytest.raises(DuplicateRun) as refused:
        _create(journal, second, "order-7")
    assert refused.value.live_run_id == third
