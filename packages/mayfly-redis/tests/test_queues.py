"""Redis queue flow control beyond the contract suite: dedup ids freed, slots freed by expiry, racing creators.

Every check reads the store (entries, usage, grants), against the private AOF server.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mayfly.errors import CompatibilityError, CorruptionError, DuplicateRun, InvalidRecord
from mayfly.queues import QUEUE_CONTROL, QueueSettings, QueueUsage
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis.testing import RedisClusterNodes, RedisServer

if TYPE_CHECKING:
    from conftest import Records

NOW = 1_800_000_000_000


@pytest.fixture
def url(aof_server: RedisServer) -> str:
    """A journal URL under a prefix of this test alone."""
    return f"{aof_server.url}?prefix=qc.{uuid.uuid4().hex[:12]}"


@pytest.fixture
def journal(url: str) -> Iterator[RedisJournal]:
    """A journal under the test's prefix."""
    with RedisJournal(url) as opened:
        yield opened


def entry(run_id: str, status: str = "new", *, sequence: int = 1, **fields: object) -> IndexEntry:
    return IndexEntry(
        run_id=run_id,
        queue=str(fields.pop("queue", "q")),
        status=IndexStatus(status),
        ready_at_ms=None if status == "terminal" else int(fields.pop("ready", NOW)),  # type: ignore[call-overload]
        sequence=sequence,
        **fields,  # type: ignore[arg-type]
    )


def create(journal: RedisJournal, records: Records, dedup: str, queue: str = "q") -> str:
    """Create a run (one record) whose entry carries ``dedup``; return its id."""
    run = records.new_id()
    journal.append_indexed(
        run, 1, records.batch(run, 1), None, lambda: entry(run, dedup_id=dedup, queue=queue)
    )
    return run


def test_a_standalone_journal_declares_queue_control(journal: RedisJournal) -> None:
    """queue_control is declared beside run_index and served by the journal itself."""
    assert journal.capabilities.queue_control and journal.capabilities.run_index
    assert QUEUE_CONTROL.of(journal) is journal


def test_a_cluster_declares_no_queue_control(aof_cluster: RedisClusterNodes) -> None:
    """A Cluster keeps no run index, so no queue control either; asking for settings says why."""
    with RedisJournal(aof_cluster.url + "?prefix=clusterqueues") as journal:
        assert not journal.capabilities.queue_control
        assert QUEUE_CONTROL.of(journal) is None
        with pytest.raises(CompatibilityError, match="standalone"):
            journal.queue_get("q")
        with pytest.raises(CompatibilityError, match="standalone"):
            journal.queue_set(QueueSettings(name="q", concurrency=1))


def test_unreadable_stored_settings_fail_closed(journal: RedisJournal, aof_server: RedisServer) -> None:
    """Settings damaged in the store raise CorruptionError naming the queue, for get and list."""
    journal.queue_set(QueueSettings(name="q", concurrency=2))
    assert journal.queue_list() == [QueueSettings(name="q", concurrency=2)]
    key = f"{journal.url.split('prefix=')[1]}:queue-settings"
    subprocess.run(
        ["redis-cli", "-p", str(aof_server.port), "HSET", key, "q", '{"name":"q","concurrency":0}'],
        check=True,
        capture_output=True,
    )
    with pytest.raises(CorruptionError, match="queue q"):
        journal.queue_get("q")
    with pytest.raises(CorruptionError, match="queue q"):
        journal.queue_list()


def test_a_dedup_id_is_freed_when_its_run_ends_by_append_or_put(
    journal: RedisJournal, records: Records
) -> None:
    """The id comes free when the holder's entry turns terminal, whether appended or put."""
    first = create(journal, records, "order-1")
    with pytest.raises(DuplicateRun) as refused:
        create(journal, records, "order-1")
    assert refused.value.live_run_id == first and refused.value.queue == "q"
    journal.append_indexed(
        first,
        2,
        records.batch(first, 2),
        None,
        lambda: entry(first, "terminal", sequence=2, dedup_id="order-1"),
    )
    second = create(journal, records, "order-1")
    journal.index_put([entry(second, "terminal", sequence=5, dedup_id="order-1")])
    third = create(journal, records, "order-1")
    assert journal.index_get(third) is not None


def test_a_dedup_id_is_freed_when_its_run_is_purged(journal: RedisJournal, records: Records) -> None:
    """Purging the live holder frees the id; a refused creation left no keys behind."""
    first = create(journal, records, "invoice-7")
    refused_run = records.new_id()
    with pytest.raises(DuplicateRun):
        journal.append_indexed(
            refused_run,
            1,
            records.batch(refused_run, 1),
            None,
            lambda: entry(refused_run, dedup_id="invoice-7"),
        )
    assert journal.next_sequence(refused_run) == 1 and journal.index_get(refused_run) is None
    assert refused_run not in journal.list_runs()
    assert journal.purge_run(first)
    assert journal.index_get(create(journal, records, "invoice-7")) is not None


def test_a_repair_put_never_takes_a_live_runs_dedup_id(journal: RedisJournal, records: Records) -> None:
    """index_put of a second live entry with the id stores it but the first run keeps the id."""
    first = create(journal, records, "d-1")
    other = records.new_id()
    journal.index_put([entry(other, dedup_id="d-1")])
    with pytest.raises(DuplicateRun) as refused:
        create(journal, records, "d-1")
    assert refused.value.live_run_id == first


def test_a_holders_expired_lease_frees_its_concurrency_slot_without_a_release(
    journal: RedisJournal, records: Records
) -> None:
    """Concurrency 1: a claimant that dies (short ttl, no release) holds the slot only until its lease expires."""
    journal.queue_set(QueueSettings(name="q", concurrency=1))
    runs = [records.new_id() for _ in range(2)]
    journal.index_put([entry(run, ready=NOW + i) for i, run in enumerate(runs)])
    dead = journal.claim("dies", limit=5, ttl_ms=300, now_ms=NOW)
    assert [guard.run_id for guard in dead] == [runs[0]]
    assert journal.claim("other", limit=5, ttl_ms=60_000, now_ms=NOW) == []
    assert journal.queue_usage("q", now_ms=NOW).in_progress == 1
    time.sleep(0.45)
    assert journal.queue_usage("q", now_ms=NOW) == QueueUsage(in_progress=0, recent_starts=0)
    rescued = journal.claim("other", limit=5, ttl_ms=60_000, now_ms=NOW)
    assert [guard.run_id for guard in rescued] == [runs[0]], "the orphan first, and only one"
    assert journal.queue_usage("q", now_ms=NOW).in_progress == 1
    rescued[0].release()
    assert journal.queue_usage("q", now_ms=NOW).in_progress == 0


def test_runs_leased_before_the_queue_had_settings_count_against_its_limit(
    journal: RedisJournal, records: Records, url: str
) -> None:
    """A limit set on a busy queue counts the runs claimed (or acquired) before it was set."""
    runs = [records.new_id() for _ in range(4)]
    journal.index_put([entry(run, ready=NOW + i) for i, run in enumerate(runs)])
    early = journal.claim("early", limit=1, ttl_ms=60_000, now_ms=NOW)
    assert [guard.run_id for guard in early] == [runs[0]]
    journal.queue_set(QueueSettings(name="q", concurrency=2))
    assert journal.queue_usage("q", now_ms=NOW).in_progress == 1
    with RedisLeaseStore(url) as leases:
        acquired = leases.acquire(runs[3], "foreground", ttl_ms=60_000)
        assert journal.queue_usage("q", now_ms=NOW).in_progress == 2
        assert journal.claim("late", limit=5, ttl_ms=60_000, now_ms=NOW) == []
        acquired.release()
    assert [guard.run_id for guard in journal.claim("late", limit=5, ttl_ms=60_000, now_ms=NOW)] == [runs[1]]


def test_limits_combine_and_bad_held_changes_nothing(journal: RedisJournal, records: Records) -> None:
    """Concurrency, per-worker and rate limits apply together (the smallest wins); bad held is refused."""
    journal.queue_set(
        QueueSettings(name="q", concurrency=3, worker_concurrency=2, rate_limit=1, rate_period_ms=1000)
    )
    runs = [records.new_id() for _ in range(3)]
    journal.index_put(
        [entry(runs[0], "running"), entry(runs[1], ready=NOW + 1), entry(runs[2], ready=NOW + 2)]
    )
    with pytest.raises(InvalidRecord):
        journal.claim("w", limit=5, ttl_ms=60_000, now_ms=NOW + 5, held={"q": True})  # type: ignore[dict-item]
    # per worker 2: two runs; the running one is no start, and the rate allows one start.
    got = journal.claim("w", limit=5, ttl_ms=60_000, now_ms=NOW + 5, held={"q": 0})
    assert [guard.run_id for guard in got] == runs[:2]
    assert journal.claim("w", limit=5, ttl_ms=60_000, now_ms=NOW + 5) == [], "rate: one start per second"
    assert journal.queue_usage("q", now_ms=NOW + 5) == QueueUsage(in_progress=2, recent_starts=1)
    entry_of = journal.index_get(runs[0])
    assert entry_of is not None and entry_of.started_ms is None, "a running run's claim is no start"
    later = journal.claim("w", limit=5, ttl_ms=60_000, now_ms=NOW + 1006)
    assert [guard.run_id for guard in later] == [runs[2]]


RACER = textwrap.dedent(
    """
    import sys
    from mayfly.errors import DuplicateRun
    from mayfly.identity import Uuid7IdSource
    from mayfly.journal import JournalRecord
    from mayfly.runindex import IndexEntry, IndexStatus
    from mayfly_redis import RedisJournal
    url, dedup = sys.argv[1], sys.argv[2]
    ids = Uuid7IdSource()
    run = ids.new_id()
    record = JournalRecord.seal(run_id=run, sequence=1, event_id=ids.new_id(), event_type="Probe",
                                schema_version=1, payload=b"{}")
    entry = IndexEntry(run_id=run, queue="q", status=IndexStatus.NEW, ready_at_ms=1, sequence=1,
                       dedup_id=dedup)
    with RedisJournal(url) as journal:
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            journal.append_indexed(run, 1, [record], None, lambda: entry)
            print("created", run, flush=True)
        except DuplicateRun as refused:
            print("refused", run, refused.live_run_id, flush=True)
    """
)


def test_two_clients_creating_one_dedup_id_at_once_exactly_one_wins(
    journal: RedisJournal, records: Records, url: str
) -> None:
    """Both pass the append's checks before either writes: the second write is refused, naming the first."""
    winner: list[str] = []
    with RedisJournal(url) as rival:

        def first_entry() -> IndexEntry:
            # The first client's checks passed; the rival creates its run before the first writes.
            winner.append(create(rival, records, "same"))
            return entry(loser, dedup_id="same")

        loser = records.new_id()
        with pytest.raises(DuplicateRun) as refused:
            journal.append_indexed(loser, 1, records.batch(loser, 1), None, first_entry)
    assert refused.value.live_run_id == winner[0]
    assert journal.next_sequence(loser) == 1 and journal.index_get(loser) is None


def test_racing_processes_creating_one_dedup_id_create_exactly_one_run(url: str, tmp_path: Path) -> None:
    """Four processes submit the same dedup id at once: one creates its run, three are refused naming it."""
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    racers = [
        subprocess.Popen(
            [sys.executable, str(script), url, "shared"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for process in racers:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in racers:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    lines = [process.communicate(timeout=60)[0].split() for process in racers]
    assert all(process.returncode == 0 for process in racers)
    created = [line[1] for line in lines if line[0] == "created"]
    assert len(created) == 1, lines
    assert all(line[2] == created[0] for line in lines if line[0] == "refused")
    with RedisJournal(url) as journal:
        assert journal.list_runs() == created
