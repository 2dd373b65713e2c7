"""Claims across processes: claimants racing over one environment never get the same run."""

from __future__ import annotations

import time

from lmdb_support import Worker, new_id

from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore


def test_four_claimant_processes_racing_over_200_runs_claim_each_exactly_once(
    url: str, workers: list[Worker]
) -> None:
    """4 processes claim in random batches at once: the union is every run, with no run handed out twice."""
    now = int(time.time() * 1000)
    runs = [
        IndexEntry(run_id=new_id(), status=IndexStatus.NEW, ready_at_ms=now - i, sequence=1, priority=i % 3)
        for i in range(200)
    ]
    with LmdbJournal(url) as journal:
        journal.index_put(runs)
    claimants = [Worker("claim", url=url, owner=f"claimant-{i}", seed=i) for i in range(4)]
    workers.extend(claimants)
    for claimant in claimants:
        assert claimant.readline() == "ready"
    for claimant in claimants:
        assert claimant.process.stdin is not None
        claimant.process.stdin.write("go\n")
        claimant.process.stdin.flush()
    claims: dict[str, list[tuple[str, int]]] = {}
    counts = []
    for index, claimant in enumerate(claimants):
        while not (line := claimant.readline()).startswith("done"):
            _, run_id, token = line.split()
            claims.setdefault(run_id, []).append((f"claimant-{index}", int(token)))
        counts.append(int(line.split()[1]))
    assert sorted(claims) == sorted(run.run_id for run in runs)
    duplicated = {run: owners for run, owners in claims.items() if len(owners) != 1}
    assert duplicated == {}
    assert sum(counts) == len(runs)
    assert sum(1 for count in counts if count) >= 2  # they did race: more than one got runs
    with LmdbLeaseStore(url) as leases:
        for run_id, [(_, token)] in claims.items():
            assert leases.current_fence(run_id) == token  # each run was granted exactly one token
