"""The Redis run index behaves exactly as the file journal's reference index under the same operations."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import msgspec
import pytest

from mayfly.journal import JournalRecord
from mayfly.lease import RecoveryLeaseGuard
from mayfly.local import LocalWorkflowJournal
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_redis import RedisJournal
from mayfly_redis.testing import RedisServer

NOW = 1_800_000_000_000
QUEUES = ("default", "other")


def random_entry(rng: random.Random, run_id: str, runs: list[str]) -> IndexEntry:
    status = rng.choice(list(IndexStatus))
    ready = None if rng.random() < 0.25 else NOW + rng.randint(-50, 50)
    return IndexEntry(
        run_id=run_id,
        queue=rng.choice(QUEUES),
        status=status,
        ready_at_ms=ready,
        sequence=rng.randint(0, 6),
        wake=rng.random() < 0.2,
        parent=rng.choice(runs) if rng.random() < 0.1 else None,
        priority=rng.choice((0, 0, 0, 1, -2)),
    )


def _unstarted(entry: IndexEntry | None) -> IndexEntry | None:
    return None if entry is None else msgspec.structs.replace(entry, started_ms=None)


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_agree_with_the_file_journal(
    aof_server: RedisServer, tmp_path: Path, seed: int
) -> None:
    """Puts, wakes, claims, releases and next_wake give the same answers on Redis as on file://, step by step."""
    rng = random.Random(seed)
    runs = sorted(str(uuid.uuid4()) for _ in range(10))
    local = LocalWorkflowJournal(f"file://{tmp_path}/store?durability=write")
    remote = RedisJournal(f"{aof_server.url}?prefix=model.{uuid.uuid4().hex[:8]}")
    held: list[tuple[RecoveryLeaseGuard, RecoveryLeaseGuard]] = []
    granted = woken = 0
    try:
        for run in runs:  # each run's journal is past every sequence an entry names: no entry is ahead of it
            history = [
                JournalRecord.seal(
                    run_id=run,
                    sequence=sequence,
                    event_id=str(uuid.uuid4()),
                    event_type="Probe",
                    schema_version=1,
                    payload=b"{}",
                )
                for sequence in range(1, 8)
            ]
            local.append(run, 1, history)
            remote.append(run, 1, history)
        for step in range(250):
            action = rng.random()
            where = f"seed {seed} step {step}"
            if action < 0.4:
                batch = [random_entry(rng, rng.choice(runs), runs) for _ in range(rng.randint(1, 3))]
                local.index_put(batch)
                remote.index_put(batch)
            elif action < 0.5:
                run = rng.choice(runs)
                answer = local.index_wake(run)
                assert answer == remote.index_wake(run), where
                woken += answer
            elif action < 0.75:
                limit = rng.randint(1, 4)
                now = NOW + rng.randint(-60, 60)
                queues = rng.choice((None, ["default"], ["other"], ["default", "other"]))
                mine = local.claim("l", limit=limit, ttl_ms=600_000, now_ms=now, queues=queues)
                theirs = remote.claim("r", limit=limit, ttl_ms=600_000, now_ms=now, queues=queues)
                assert [g.run_id for g in mine] == [g.run_id for g in theirs], where
                held += list(zip(mine, theirs, strict=True))
                granted += len(mine)
            elif action < 0.9 and held:
                pair = held.pop(rng.randrange(len(held)))
                for guard in pair:
                    guard.release()
            else:
                now = NOW + rng.randint(-60, 60)
                assert local.next_wake(now_ms=now) == remote.next_wake(now_ms=now), where
            for run in runs:
                # Each store records a start at its own claim time: compare the entries without it.
                assert _unstarted(local.index_get(run)) == _unstarted(remote.index_get(run)), (where, run)
        assert granted > 20 and woken > 5, (granted, woken)  # the sequence exercised claims and wakes
    finally:
        for pair in held:
            for guard in pair:
                guard.release()
        local.close()
        remote.close()
