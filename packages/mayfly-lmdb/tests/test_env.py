"""The shared environment: one handle per process, map growth, durability refusal and error mapping."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import lmdb
import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.model.errors import (
    CompatibilityError,
    DurabilityUnavailable,
    InvalidBackendURL,
    JournalUnavailable,
    LimitExceeded,
)
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore, LmdbMapFull
from mayfly_lmdb._env import filesystem_type


def test_journal_and_leases_share_one_handle(url: str) -> None:
    """A journal and a lease store of one directory share the process's single LMDB handle."""
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases, LmdbJournal(url) as second:
        assert journal._env is second._env is leases._env
        assert journal._env.references == 3
    with LmdbJournal(url) as reopened:
        assert reopened._env.references == 1


def test_a_second_durability_in_one_process_is_refused(url: str) -> None:
    """Opening an open environment with another durability raises InvalidBackendURL, naming both."""
    with LmdbJournal(url), pytest.raises(InvalidBackendURL, match="durability=sync"):
        LmdbJournal(url + "?durability=nosync")


def test_the_map_grows_and_keeps_every_acknowledged_record(env_dir: Path) -> None:
    """A tiny map fills, grows on demand, and every acknowledged record is there after reopening."""
    url = f"lmdb://{env_dir}?map_size=64k"
    run = new_id()
    with LmdbJournal(url) as journal:
        first_size = journal.map_size
        for sequence in range(1, 600, 3):
            journal.append(run, sequence, batch(run, sequence, 3, size=1500))
        grown = journal.map_size
    assert first_size == 64 << 10
    assert grown > 4 * first_size
    with LmdbJournal(url) as reopened:
        records = reopened.read(run)
    assert [record.sequence for record in records] == list(range(1, 601))


def test_the_map_stops_at_max_map_size_with_a_typed_error(env_dir: Path) -> None:
    """Past max_map_size an append raises LmdbMapFull naming the option; nothing of it is written."""
    url = f"lmdb://{env_dir}?map_size=64k&max_map_size=256k"
    run = new_id()
    acknowledged = 0
    with LmdbJournal(url) as journal:
        with pytest.raises(LmdbMapFull, match="max_map_size") as caught:
            while True:
                journal.append(run, acknowledged + 1, batch(run, acknowledged + 1, 2, size=1500))
                acknowledged += 2
        assert isinstance(caught.value, LimitExceeded)
        assert caught.value.limit == 256 << 10
        assert journal.next_sequence(run) == acknowledged + 1
        assert len(journal.read(run)) == acknowledged
    assert acknowledged > 0
    with LmdbJournal(f"lmdb://{env_dir}?map_size=64k&max_map_size=4MiB") as roomier:
        roomier.append(run, acknowledged + 1, batch(run, acknowledged + 1, 2, size=1500))
        assert len(roomier.read(run)) == acknowledged + 2


def test_growth_from_another_process_is_adopted(env_dir: Path, workers: list[Worker]) -> None:
    """When another process grows the map past this one's, reads and appends adopt the new size."""
    url = f"lmdb://{env_dir}?map_size=64k&durability=nosync"
    mine, theirs = new_id(), new_id()
    with LmdbJournal(url) as journal:
        journal.append(mine, 1, batch(mine, 1))
        worker = Worker("append", url=url, run_id=theirs, batches=300, batch=3, size=1500, tag="0000000a")
        workers.append(worker)
        lines = worker.finish()
        assert lines[-1] == "done"
        assert journal.map_size == 64 << 10  # nothing done here yet
        assert len(journal.read(theirs)) == 900
        assert journal.map_size > 64 << 10
        journal.append(mine, 2, batch(mine, 2, 3, size=1500))
        assert [r.sequence for r in journal.read(mine)] == [1, 2, 3, 4]


def test_threads_growing_one_map_lose_nothing(env_dir: Path) -> None:
    """Threads appending while the map grows under them each keep every acknowledged record."""
    url = f"lmdb://{env_dir}?map_size=64k&durability=nosync"
    runs = [new_id() for _ in range(4)]
    errors: list[BaseException] = []
    with LmdbJournal(url) as journal:

        def write(run: str) -> None:
            try:
                for sequence in range(1, 150, 3):
                    journal.append(run, sequence, batch(run, sequence, 3, size=1000))
            except BaseException as error:  # reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=write, args=(run,)) for run in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert all(len(journal.read(run)) == 150 for run in runs)


def test_sync_on_tmpfs_is_refused() -> None:
    """durability=sync on a tmpfs directory raises DurabilityUnavailable; explicit nosync opens."""
    shm = Path("/dev/shm")
    assert filesystem_type(shm) == "tmpfs", "this test needs /dev/shm mounted as tmpfs (Linux)"
    directory = shm / f"mayfly-lmdb-test-{os.getpid()}-{new_id()}"
    try:
        with pytest.raises(DurabilityUnavailable, match="nosync"):
            LmdbJournal(f"lmdb://{directory}")
        assert not directory.exists()
        with LmdbJournal(f"lmdb://{directory}?durability=nosync") as journal:
            assert journal.durability.value == "write"
            run = new_id()
            journal.append(run, 1, batch(run, 1))
    finally:
        for name in ("data.mdb", "lock.mdb"):
            (directory / name).unlink(missing_ok=True)
        if directory.exists():
            directory.rmdir()


def test_sync_mode_really_syncs(tmp_path: Path) -> None:
    """A sync journal's environment has LMDB's sync and metasync flags on; nosync has sync off."""
    with LmdbJournal(f"lmdb://{tmp_path}/a") as journal:
        flags = journal._env.env.flags()
        assert flags["sync"] and flags["metasync"]
    with LmdbJournal(f"lmdb://{tmp_path}/b?durability=nosync") as journal:
        assert not journal._env.env.flags()["sync"]


def test_readonly_needs_an_existing_journal(env_dir: Path) -> None:
    """readonly=true on a missing environment raises JournalUnavailable and creates nothing."""
    with pytest.raises(JournalUnavailable):
        LmdbJournal(f"lmdb://{env_dir}?readonly=true")
    assert not env_dir.exists()


def test_readonly_refuses_writes(url: str) -> None:
    """A read-only journal reads what a writer stored and refuses appends and snapshots."""
    run = new_id()
    with LmdbJournal(url) as writer:
        writer.append(run, 1, batch(run, 1, 2))
    with LmdbJournal(url + "?readonly=true") as reader:
        assert [r.sequence for r in reader.read(run)] == [1, 2]
        with pytest.raises(JournalUnavailable, match="readonly"):
            reader.append(run, 3, batch(run, 3))
        with pytest.raises(InvalidBackendURL):
            LmdbJournal(url)


def test_a_foreign_environment_is_refused(env_dir: Path) -> None:
    """An LMDB environment holding another format marker raises CompatibilityError."""
    env_dir.mkdir()
    env = lmdb.open(str(env_dir), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format", b"someone-else/9", db=meta)
    env.close()
    with pytest.raises(CompatibilityError, match="someone-else"):
        LmdbJournal(f"lmdb://{env_dir}")


def test_a_garbage_data_file_is_a_typed_error(env_dir: Path) -> None:
    """A data file that is not LMDB raises a Mayfly error, never a raw lmdb.Error."""
    env_dir.mkdir()
    (env_dir / "data.mdb").write_bytes(b"not an lmdb file at all" * 400)
    with pytest.raises((CompatibilityError, JournalUnavailable)):
        LmdbJournal(f"lmdb://{env_dir}")


def test_an_unwritable_directory_is_journal_unavailable(tmp_path: Path) -> None:
    """A path that cannot be created raises JournalUnavailable naming it."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(JournalUnavailable, match="file"):
        LmdbJournal(f"lmdb://{blocker}/env")


def test_a_readonly_journal_sharing_a_writable_handle_still_refuses_writes(url: str) -> None:
    """A readonly journal opened while a writable one of the same directory is open refuses appends."""
    run = new_id()
    with LmdbJournal(url) as writer, LmdbJournal(url + "?readonly=true") as reader:
        assert reader._env is writer._env
        writer.append(run, 1, batch(run, 1))
        assert len(reader.read(run)) == 1
        with pytest.raises(JournalUnavailable, match="readonly"):
            reader.append(run, 2, batch(run, 2))
        assert writer.next_sequence(run) == 2


def test_a_readonly_inspector_with_a_small_map_adopts_growth(env_dir: Path, workers: list[Worker]) -> None:
    """A readonly journal mapped smaller than the data another process wrote adopts the larger map."""
    url = f"lmdb://{env_dir}?map_size=64k&durability=nosync"
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1))
    with LmdbJournal(f"lmdb://{env_dir}?map_size=64k&readonly=true") as reader:
        worker = Worker("append", url=url, run_id=run, batches=100, batch=3, size=1500, tag="0000000e")
        workers.append(worker)
        assert worker.finish()[-1] == "done"
        assert len(reader.read(run)) == 301
        assert reader.map_size > 64 << 10


def test_reader_slots_of_killed_processes_are_cleared(url: str, workers: list[Worker]) -> None:
    """A reader slot left by a SIGKILLed process is cleared when the environment is opened again."""
    with LmdbJournal(url):
        pass
    reader = Worker("read-hold", url=url)
    workers.append(reader)
    _, pid, _ = reader.readline().split()
    with LmdbJournal(url) as journal:
        assert f"{pid} " in journal._env.env.readers().replace("\n", " ")
    reader.kill()
    with LmdbJournal(url) as journal:
        slots = journal._env.env.readers()
    assert f"{pid} " not in slots.replace("\n", " ")


def test_an_environment_of_another_program_is_left_alone(env_dir: Path) -> None:
    """An LMDB environment holding another program's data raises CompatibilityError, gains nothing."""
    env_dir.mkdir()
    env = lmdb.open(str(env_dir), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    with pytest.raises(CompatibilityError, match="another program"):
        LmdbJournal(f"lmdb://{env_dir}")
    env = lmdb.open(str(env_dir), max_dbs=8)
    with env.begin() as txn:
        assert [key for key, _ in txn.cursor()] == [b"hello"]
    env.close()


_LOCK_TXNID_OFFSET = 48  # MDB_txbody.mtb_txnid in lock.mdb (LMDB 0.9, 64-bit Linux, robust mutexes)


def test_readers_recover_from_a_writer_killed_inside_its_commit(env_dir: Path, workers: list[Worker]) -> None:
    """After a writer died between writing its meta page and publishing it, reads see its commit."""
    url = f"lmdb://{env_dir}?durability=nosync"
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 2))
        last = journal._env.env.info()["last_txnid"]
        writer = Worker("die-writing", url=url)
        workers.append(writer)
        assert writer.readline() == f"writing {last + 1}"
        writer.kill()  # dies owning LMDB's writer mutex
        # Leave the lock table one transaction behind the newest meta page, as a commit cut
        # between its meta write and its txnid publication does.
        fd = os.open(env_dir / "lock.mdb", os.O_RDWR)
        try:
            published = int.from_bytes(os.pread(fd, 8, _LOCK_TXNID_OFFSET), "little")
            assert published == last, "lock.mdb layout differs from LMDB 0.9 on 64-bit Linux"
            os.pwrite(fd, (last - 1).to_bytes(8, "little"), _LOCK_TXNID_OFFSET)
        finally:
            os.close(fd)
        stale = journal._env.env.begin()
        assert stale.id() == last - 1  # what any reader would see without the repair
        stale.abort()
        assert journal.next_sequence(run) == 3
        assert [r.sequence for r in journal.read(run)] == [1, 2]
        journal.append(run, 3, batch(run, 3))
        assert journal.next_sequence(run) == 4
