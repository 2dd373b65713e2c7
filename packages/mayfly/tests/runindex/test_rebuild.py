"""Rebuilding the run index from the journals: a store from before the index, a damaged or stale index."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.cli import main
from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.recovery import inspect_run, rebuild_run_index
from mayfly.runindex import RUN_INDEX, IndexEntry, IndexStatus, index_entry
from mayfly.runtime import WaitForSignal, WorkflowRuntime, new_signal_token
from mayfly.worker import Worker


def spec(name: str, *handlers: str) -> WorkflowSpec:
    nodes = tuple(
        Node(f"n{i}", handler=h, depends_on=(f"n{i - 1}",) if i else ()) for i, h in enumerate(handlers)
    )
    return WorkflowSpec(workflow_id=f"rebuild.{name}", version=1, nodes=nodes)


def registry() -> HandlerRegistry:
    reg = HandlerRegistry()
    reg.register("ok", 1, lambda req: Succeeded())

    def park(req: object) -> object:
        return WaitForSignal("go", new_signal_token(), timeout_ms=3_600_000)

    reg.register("park", 1, park)
    return reg


def populate(url: str) -> tuple[WorkflowRuntime, list[str]]:
    """Three runs in three index states: a finished one, one parked on a signal, one never driven."""
    runtime = WorkflowRuntime(url, registry())
    done = runtime.execute(spec("done", "ok@1", "ok@1")).run_id
    parked = runtime.execute(spec("parked", "park@1")).run_id
    new = runtime.start(spec("new", "ok@1")).run_id
    return runtime, [done, parked, new]


def truth(runtime: WorkflowRuntime, run_id: str) -> IndexEntry:
    return index_entry(inspect_run(runtime.journal, run_id).state)


def test_a_store_whose_index_was_lost_gets_every_entry_back(tmp_path: Path) -> None:
    """Deleting index.sqlite3 (a store from before the index) leaves runs unfindable until a rebuild."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    expected = {run_id: truth(runtime, run_id) for run_id in runs}
    assert [expected[r].status for r in runs] == [IndexStatus.TERMINAL, IndexStatus.WAITING, IndexStatus.NEW]
    runtime.journal.close()
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        (tmp_path / "store" / name).unlink(missing_ok=True)

    runtime = WorkflowRuntime(url, registry())
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    assert all(index.index_get(run_id) is None for run_id in runs)
    assert index.claim("w", limit=10, ttl_ms=1_000, now_ms=2**50) == []  # nothing found before the rebuild
    log: list[dict[str, object]] = []
    Worker(url, registry(), poll_interval_ms=20, log=log.append).run(until=lambda: bool(log))
    [warning] = [e for e in log if e["event"] == "index_incomplete"]
    assert "mayfly index rebuild" in str(warning["error"])

    seen: list[int] = []
    assert rebuild_run_index(runtime.journal, progress=seen.append) == 3
    assert seen == [3]
    assert {run_id: index.index_get(run_id) for run_id in runs} == expected
    # The never-driven run is found again, and a worker finishes it.
    Worker(url, registry(), poll_interval_ms=20).run(
        until=lambda: runtime.handle(runs[2]).status() == "succeeded"
    )


def test_a_stale_entry_is_repaired_and_a_correct_index_is_unchanged(tmp_path: Path) -> None:
    """An entry that says a run ended while it has work is corrected; correct entries stay as they are."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    before = {run_id: index.index_get(run_id) for run_id in runs}
    new = truth(runtime, runs[2])
    stale = IndexEntry(
        run_id=new.run_id, status=IndexStatus.TERMINAL, ready_at_ms=None, sequence=new.sequence
    )
    index.index_put([stale])
    assert index.index_get(runs[2]) == stale
    assert rebuild_run_index(runtime.journal) == 3
    assert {run_id: index.index_get(run_id) for run_id in runs} == before
    assert rebuild_run_index(runtime.journal) == 3  # idempotent
    assert {run_id: index.index_get(run_id) for run_id in runs} == before


def test_an_unreadable_run_is_named_after_the_others_are_indexed(tmp_path: Path) -> None:
    """A damaged run does not stop the rebuild; the error names it and says what to do."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    runtime.journal.close()
    (tmp_path / "store" / "index.sqlite3").unlink()
    damaged = runs[1]
    [path] = [p for p in (tmp_path / "store").rglob(f"*{damaged}*") if p.is_file() and p.stat().st_size > 64]
    data = bytearray(path.read_bytes())
    data[40] ^= 0x10  # a bit flip inside the first frame
    path.write_bytes(bytes(data))

    runtime = WorkflowRuntime(url, registry())
    with pytest.raises(
        CorruptionError, match=rf"2 run\(s\) indexed, 1 could not be read: {damaged}.*mayfly replay"
    ):
        rebuild_run_index(runtime.journal)
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    assert index.index_get(runs[0]) is not None and index.index_get(runs[2]) is not None
    assert index.index_get(damaged) is None


def test_a_journal_without_an_index_is_refused(tmp_path: Path) -> None:
    declared = WorkflowRuntime(f"file://{tmp_path}/store").journal.capabilities

    class Plain:
        """A journal as far as the feature check looks: it declares no run index."""

        url = "plain://"
        capabilities = msgspec.structs.replace(declared, run_index=False)

    with pytest.raises(CompatibilityError, match="keeps no run index"):
        rebuild_run_index(Plain())  # type: ignore[arg-type]


def test_mayfly_index_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mayfly index rebuild` prints what it did (and `--json` a document); exit 0."""
    url = f"file://{tmp_path}/store?durability=write"
    runtime, _ = populate(url)
    runtime.journal.close()
    (tmp_path / "store" / "index.sqlite3").unlink()
    assert main(["--journal", url, "index", "rebuild"]) == 0
    assert "run index rebuilt: 3 runs" in capsys.readouterr().out
    assert main(["--journal", url, "--json", "index", "rebuild"]) == 0
    assert json.loads(capsys.readouterr().out)["runs_indexed"] == 3
    assert main(["--journal", url, "index", "drop"]) == 2


def test_an_entry_ahead_of_the_journal_is_repaired(tmp_path: Path) -> None:
    """An entry written before frames a crash lost (a later sequence than the journal holds) is replaced.

    Otherwise the sequence rule would keep it for good, and a run parked on a
    signal would be claimed on every poll.
    """
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    parked = runs[1]
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    true = truth(runtime, parked)
    ahead = IndexEntry(run_id=parked, status=IndexStatus.RUNNING, ready_at_ms=0, sequence=true.sequence + 3)
    index.index_put([ahead])
    assert index.index_get(parked) == ahead
    claimed = index.claim("w", limit=10, ttl_ms=1_000, now_ms=0)
    for guard in claimed:
        guard.release()
    assert sorted(g.run_id for g in claimed) == sorted([runs[2], parked])
    assert rebuild_run_index(runtime.journal, runs=[parked]) == 1
    assert index.index_get(parked) == true
    # An entry of a later sequence that the journal does hold is never replaced by an older one.
    index.index_put([IndexEntry(run_id=parked, status=IndexStatus.TERMINAL, ready_at_ms=None, sequence=1)])
    assert index.index_get(parked) == true


def test_a_purged_run_has_no_entry_and_is_never_claimed(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    new = runs[2]
    assert runtime.journal.purge_run(new)  # type: ignore[attr-defined]
    assert index.index_get(new) is None
    assert index.claim("w", limit=10, ttl_ms=1_000, now_ms=int(time.time() * 1000)) == []


def test_a_rebuild_of_chosen_runs_names_an_unknown_one(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store?durability=write"
    runtime, runs = populate(url)
    unknown = runtime.ids.new_id()
    with pytest.raises(CorruptionError, match=rf"1 run\(s\) indexed, 1 could not be read: {unknown}"):
        rebuild_run_index(runtime.journal, runs=[runs[0], unknown])
