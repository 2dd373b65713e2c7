"""Exhaustive single-bit flips of a small local journal: every flip is detected or leaves the exact history.

Each trial flips one bit of an acknowledged frame in a copy of a small store,
then looks at the run through fresh journal instances, as a new process
would: ``read``, ``next_sequence``, ``verify_run`` and an ``append``. Every
look must either raise a typed :class:`~mayfly.model.errors.MayflyError` or
see exactly the original history; none may see a different valid one (the
defect this pins: a damaged length read as a torn tail, silently dropping
acknowledged records). An append must never cut or overwrite the damaged
bytes: it raises and leaves the file as it was, or appends after all of it.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import HEADER, HEADER_V1
from mayfly.model.errors import MayflyError

IDS = Uuid7IdSource()
BATCHES = (1, 3, 2, 1, 2)  # frames per acknowledged batch
RANDOM_BODY_FLIPS = 300


def sealed(run: str, sequence: int, text: str) -> JournalRecord:
    return JournalRecord.seal(
        run_id=run,
        sequence=sequence,
        event_id=IDS.new_id(),
        event_type="Tested",
        schema_version=1,
        payload=json.dumps({"n": sequence, "text": text}).encode(),
    )


def v1_frames(records: list[JournalRecord]) -> bytes:
    """The batch as version-1 MWJ1 frames, as a store written before MWJ2 holds them."""
    out = b""
    for record in records:
        body = json.dumps(
            {
                "v": 1,
                "run_id": record.run_id,
                "sequence": record.sequence,
                "batch_last": records[-1].sequence,
                "event_id": record.event_id,
                "event_type": record.event_type,
                "schema_version": record.schema_version,
                "checksum": record.checksum,
                "payload": record.payload.decode(),
            },
            separators=(",", ":"),
        ).encode()
        out += HEADER_V1.pack(b"MWJ1", len(body), zlib.crc32(body)) + body
    return out


@dataclass
class Store:
    """A pristine small store: its run, records, frame boundaries and file bytes."""

    root: Path
    run: str
    history: list[JournalRecord]
    frames: list[tuple[int, int, int]] = field(default_factory=list)  # (start, header size, end)
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def run_file(self) -> Path:
        return self.root / "runs" / f"{self.run}.mwj"


def build(root: Path, *, version: int, snapshot: bool) -> Store:
    """Write ``BATCHES`` as acknowledged batches (MWJ2 by the journal, or MWJ1 by hand)."""
    run = IDS.new_id()
    history: list[JournalRecord] = []
    with LocalWorkflowJournal(str(root)) as journal:
        sequence = 1
        for size in BATCHES:
            batch = [sealed(run, sequence + i, "ünï ✓" * (i + 1)) for i in range(size)]
            if version == 2:
                journal.append(run, sequence, batch)
            else:
                with open(root / "runs" / f"{run}.mwj", "ab") as handle:
                    handle.write(v1_frames(batch))
            history.extend(batch)
            sequence += size
        if snapshot:
            # Any sealed snapshot of the last record works: the journal stores it and writes its hint.
            last = history[-1]
            journal.write_snapshot(
                run,
                SnapshotRecord.seal(
                    run_id=run,
                    schema_version=1,
                    last_sequence=last.sequence,
                    last_event_id=last.event_id,
                    last_record_checksum=last.checksum,
                    spec_checksum="sha256:" + "0" * 64,
                    state_checksum="sha256:" + "1" * 64,
                    state=b"{}",
                ),
            )
        assert journal.read(run) == history
    store = Store(root=root, run=run, history=history)
    data = store.run_file.read_bytes()
    position = 0
    while position < len(data):
        if data[position : position + 4] == b"MWJ2":
            _, length, _, _ = HEADER.unpack_from(data, position)
            header = HEADER.size
        else:
            _, length, _ = HEADER_V1.unpack_from(data, position)
            header = HEADER_V1.size
        store.frames.append((position, header, position + header + length))
        position += header + length
    assert len(store.frames) == len(history)
    for path in root.rglob("*"):
        if path.is_file():
            store.files[str(path.relative_to(root))] = path.read_bytes()
    return store


@dataclass
class Tally:
    tried: int = 0
    detected: int = 0
    intact: int = 0
    wrong: list[str] = field(default_factory=list)


def restore(store: Store, damaged: bytes) -> None:
    for name, content in store.files.items():
        (store.root / name).write_bytes(content)
    store.run_file.write_bytes(damaged)


def observe(store: Store, damaged: bytes, tally: Tally, label: str) -> None:
    """Look at the damaged run as fresh processes would; record what each look saw."""
    restore(store, damaged)
    raised = False
    original = len(store.history)

    def look(name: str, action: object, expected: object) -> None:
        nonlocal raised
        with LocalWorkflowJournal(str(store.root)) as journal:
            try:
                seen = action(journal)  # type: ignore[operator]
            except MayflyError:
                raised = True
                return
        if seen != expected:
            tally.wrong.append(f"{label}: {name} saw {seen!r:.120} instead of the original")

    look("read", lambda j: j.read(store.run), store.history)
    look("read-tail", lambda j: j.read(store.run, after=original - 2), store.history[-2:])
    look("next_sequence", lambda j: j.next_sequence(store.run), original + 1)
    look("verify_run", lambda j: j.verify_run(store.run), original)
    extra = sealed(store.run, original + 1, "after")
    with LocalWorkflowJournal(str(store.root)) as journal:
        try:
            journal.append(store.run, original + 1, [extra])
        except MayflyError:
            raised = True
            if store.run_file.read_bytes() != damaged:
                tally.wrong.append(f"{label}: a refused append changed the file")
        else:
            after = store.run_file.read_bytes()
            if not after.startswith(damaged):
                tally.wrong.append(f"{label}: an append cut or overwrote bytes of the damaged file")
            if journal.read(store.run) != [*store.history, extra]:
                tally.wrong.append(f"{label}: an append was accepted onto a different history")
    tally.tried += 1
    if raised:
        tally.detected += 1
    else:
        tally.intact += 1


def flips(store: Store, *, seed: int) -> Iterator[tuple[str, int, int]]:
    """Every bit of every header byte of every frame, then seeded random bits of the bodies."""
    for number, (start, header, _end) in enumerate(store.frames, start=1):
        for offset in range(start, start + header):
            for bit in range(8):
                yield f"frame {number} header byte {offset - start} bit {bit}", offset, bit
    chooser = random.Random(seed)
    for _ in range(RANDOM_BODY_FLIPS):
        number = chooser.randrange(len(store.frames))
        start, header, end = store.frames[number]
        offset = chooser.randrange(start + header, end)
        yield f"frame {number + 1} body byte {offset - start} bit {offset % 8}", offset, chooser.randrange(8)


def campaign(store: Store, seed: int) -> Tally:
    pristine = store.run_file.read_bytes()
    tally = Tally()
    for label, offset, bit in flips(store, seed=seed):
        damaged = bytearray(pristine)
        damaged[offset] ^= 1 << bit
        observe(store, bytes(damaged), tally, label)
    return tally


@pytest.mark.parametrize("snapshot", [False, True], ids=["journal-only", "with-snapshot-and-hint"])
def test_every_single_bit_flip_of_an_mwj2_journal_is_detected(tmp_path: Path, snapshot: bool) -> None:
    """Every header bit and sampled body bits of every acknowledged MWJ2 frame: each flip raises a typed error."""
    store = build(tmp_path / "store", version=2, snapshot=snapshot)
    tally = campaign(store, seed=14)
    print(
        f"MWJ2 {'with' if snapshot else 'without'} snapshot: {tally.tried} flips tried, "
        f"{tally.detected} detected, {tally.intact} left the exact history, {len(tally.wrong)} wrong"
    )
    assert tally.wrong == []
    assert tally.detected == tally.tried  # every byte of an MWJ2 frame is covered by a CRC


def test_no_single_bit_flip_of_an_mwj1_journal_reads_as_another_history(tmp_path: Path) -> None:
    """Stores written before MWJ2: a flip is detected or changes nothing; none drops acknowledged records."""
    store = build(tmp_path / "store", version=1, snapshot=False)
    tally = campaign(store, seed=1)
    print(
        f"MWJ1: {tally.tried} flips tried, {tally.detected} detected, "
        f"{tally.intact} left the exact history, {len(tally.wrong)} wrong"
    )
    assert tally.wrong == []


def test_a_mid_log_length_pointing_past_the_end_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """The reported defect: a length bit that makes a middle frame run past the file's end fails closed."""
    for version in (1, 2):
        store = build(tmp_path / f"v{version}", version=version, snapshot=False)
        start, _header, _end = store.frames[2]
        damaged = bytearray(store.run_file.read_bytes())
        damaged[start + 4] ^= 0x80  # the length's top bit: the frame now "ends" 2 GiB later
        tally = Tally()
        observe(store, bytes(damaged), tally, f"v{version}")
        assert (tally.detected, tally.wrong) == (1, [])
        with LocalWorkflowJournal(str(store.root)) as journal, pytest.raises(MayflyError) as caught:
            journal.read(store.run)
        message = str(caught.value)
        assert store.run in message
        assert f"offset {start}" in message
        assert "after sequence 2" in message


def test_a_removed_record_is_reported_where_it_is(tmp_path: Path) -> None:
    """After record 4 of 9 is cut out, every look reports "expected sequence 4, found 5"."""
    store = build(tmp_path / "store", version=2, snapshot=False)
    start, _header, end = store.frames[3]
    data = store.run_file.read_bytes()
    restore(store, data[:start] + data[end:])
    for action in (
        lambda j: j.read(store.run),
        lambda j: j.next_sequence(store.run),
        lambda j: j.read(store.run, after=5),
        lambda j: j.verify_run(store.run),
        lambda j: j.append(store.run, 10, [sealed(store.run, 10, "x")]),
    ):
        with LocalWorkflowJournal(str(store.root)) as journal, pytest.raises(MayflyError) as caught:
            action(journal)
        assert "expected sequence 4, found 5" in str(caught.value)


def test_a_torn_tail_is_still_recovered(tmp_path: Path) -> None:
    """Cutting the last batch anywhere inside it is a torn tail: readers see the history before it, the next append cuts it."""
    store = build(tmp_path / "store", version=2, snapshot=False)
    data = store.run_file.read_bytes()
    last_batch_start = store.frames[-BATCHES[-1]][0]
    for cut in range(last_batch_start + 1, len(data)):
        restore(store, data[:cut])
        kept = store.history[: -BATCHES[-1]]
        with LocalWorkflowJournal(str(store.root)) as journal:
            assert journal.read(store.run) == kept, cut
            journal.append(store.run, len(kept) + 1, [sealed(store.run, len(kept) + 1, "again")])
        assert store.run_file.read_bytes()[:last_batch_start] == data[:last_batch_start]
