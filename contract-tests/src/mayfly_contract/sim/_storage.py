"""The ``storage`` family (file and LMDB): a store's bytes damaged between a death and the recovery.

A generated workflow runs until a seeded death; while the process is down
its store is damaged, then a new process recovers and drives the run on.
The damage, drawn per seed:

- ``torn_tail`` / ``short_write`` (file): the death came inside an append,
  before it was durable or acknowledged, and the file ends inside that
  batch (anywhere in it; or inside the last frame's body). Recovery must
  cut the tail and finish the run with the fault-free result;
- ``bit_flip`` (file: a random bit of the acknowledged bytes of the run
  file; LMDB: a stored record through the backend's fault injection) and
  ``length_field`` (file: the length field of the last acknowledged frame's
  header grows, so the frame seems to run past the end of the file, the
  damage the header CRC exists to catch): recovery must fail closed with a
  typed :class:`~mayfly.errors.CorruptionError`, or keep every acknowledged
  record unchanged;
- ``foreign_snapshot`` (file: another run's snapshot file copied over this
  run's; LMDB: the run's snapshot damaged): recovery must not use it (it
  rebuilds from the journal) or fail closed;
- ``enospc`` / ``eio`` (file): the disk itself fails inside an append: the
  file journal's ``os.write`` writes part of the batch and then raises
  ``ENOSPC`` or ``EIO``. The append must raise a typed
  :class:`~mayfly.errors.JournalUnavailable` having acknowledged nothing
  (and cut its partial batch), and a restarted process finishes the run.

A typed refusal is a pass (``failed_closed``); any other error, and any
recovery that silently lost or changed an acknowledged record or produced
another result, is a violation.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path

import mayfly.local._journal as _local_journal
from mayfly.errors import CorruptionError, JournalUnavailable, MayflyError
from mayfly.journal import FAULT_INJECTION
from mayfly.plugins import open_journal
from mayfly.testing import (
    EffectLog,
    FaultPlan,
    SimDriver,
    Violation,
    check_invariants,
    generate_workflow,
    sim_registry,
)
from mayfly_contract.sim._context import SeedContext, SeedResult

__all__ = ["FILE_DAMAGE", "LMDB_DAMAGE", "frame_offsets", "storage_family"]

FILE_DAMAGE = ("torn_tail", "short_write", "bit_flip", "length_field", "foreign_snapshot", "enospc", "eio")
LMDB_DAMAGE = ("bit_flip", "foreign_snapshot")
_HEADER = struct.Struct(">4sIII")  # MWJ2: magic, body length, body CRC-32, header CRC-32


def frame_offsets(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each complete MWJ2 frame of a run file, read from the headers' length fields."""
    frames = []
    position = 0
    while len(data) - position >= _HEADER.size:
        magic, length, _, _ = _HEADER.unpack_from(data, position)
        end = position + _HEADER.size + length
        if magic != b"MWJ2" or end > len(data):
            break
        frames.append((position, end))
        position = end
    return frames


def storage_family(ctx: SeedContext) -> SeedResult:
    """Damage the store the way a crash or a disk would, then check recovery fails closed or loses nothing."""
    rng = ctx.rng
    backend = ctx.backend
    kind = rng.choice(FILE_DAMAGE if backend.name == "file" else LMDB_DAMAGE)
    result = SeedResult("storage")
    workflow = generate_workflow(rng, signals=False)
    reference = ctx.reference(workflow)
    url = backend.url(ctx.seed)
    ids = ctx.ids()
    snapshots = kind == "foreign_snapshot"
    other = ""
    if snapshots:  # another run of the same workflow in the same store, with snapshots of its own
        other_effects = EffectLog()
        donor = SimDriver(
            backend.opener(url), sim_registry(other_effects), effects=other_effects, ids=ids, snapshot_every=2
        )
        other = ids.new_id()
        donor.run(workflow.spec, workflow.input, other, workflow.events)
        donor.close()
    operations = max(reference.operations, 2)
    death = rng.randrange(1, operations)
    unacked = kind in ("torn_tail", "short_write")
    disk = (
        _FailingDisk(errno.ENOSPC if kind == "enospc" else errno.EIO) if kind in ("enospc", "eio") else None
    )
    if disk is not None:
        plan = FaultPlan(during={death: disk.arm})
    else:
        plan = FaultPlan(
            crash_unacknowledged=[death] if unacked else [], crash_after=[] if unacked else [death]
        )
    effects = EffectLog()
    damaged: list[str] = []

    def damage(driver: SimDriver) -> None:
        if damaged or plan.last is None or disk is not None:
            return
        operation, run_id = plan.last
        if not run_id:
            return
        damaged.append(_damage(ctx, kind, url, run_id, other, effects, operation))

    lost: list[Violation] = []

    def between(driver: SimDriver) -> None:
        assert driver.journal is not None
        lost.extend(check_invariants(driver.journal.inner, {}, acknowledged=effects.acked))

    driver = SimDriver(
        backend.opener(url),
        sim_registry(effects),
        plan=plan,
        effects=effects,
        ids=ids,
        snapshot_every=2 if snapshots else 1_000,
        on_death=damage,
        on_restart=between,
    )
    run_id = driver.ids.new_id()
    refused: CorruptionError | None = None
    try:
        driver.run(workflow.spec, workflow.input, run_id, workflow.events)
        assert driver.journal is not None
        final = check_invariants(
            driver.journal.inner, {run_id: reference.expected}, acknowledged=effects.acked, effects=effects
        )
    except CorruptionError as exc:
        refused, final = exc, []
    except MayflyError as exc:
        final = [
            Violation("untyped_error", run_id, f"{type(exc).__name__} instead of a CorruptionError: {exc}")
        ]
    except Exception as exc:
        final = [Violation("driver_error", run_id, f"{type(exc).__name__}: {exc}")]
    finally:
        driver.close()
        if disk is not None:
            disk.disarm()
    if disk is not None:
        what = disk.describe()
        if disk.fired and not any(isinstance(e, JournalUnavailable) for e in driver.errors):
            final.append(Violation("untyped_error", run_id, f"{what}, but no JournalUnavailable was raised"))
        result.failed_closed += len(driver.errors)
        damaged.append(what)
    what = damaged[0] if damaged else "no damage (the death came too late)"
    result.notes.append(f"{kind}: {what}; {plan.describe()}")
    recoverable = kind in ("torn_tail", "short_write", "enospc", "eio")
    if refused is not None:
        if recoverable:
            result.violations.append(
                Violation("unreadable", run_id, f"a torn unacknowledged tail was refused: {refused}")
            )
        else:
            result.failed_closed += 1
    # An unreadable store found between steps is a refusal too (the recovery then failed closed above).
    findings = [v for v in lost + final if not (v.kind == "unreadable" and not recoverable)]
    for found in findings:
        if found.kind in ("lost_ack", "result_differs", "double_outcome"):
            found = Violation(  # noqa: PLW2901 - the same finding, named for what it means here
                "corruption_undetected" if not recoverable else found.kind,
                found.run_id,
                f"{found.message} (after {kind}: {what})",
            )
        result.violations.append(found)
    return result


def _damage(  # noqa: PLR0917 - the damage's whole context
    ctx: SeedContext, kind: str, url: str, run_id: str, other: str, effects: EffectLog, operation: str
) -> str:
    rng = ctx.rng
    if ctx.backend.name == "lmdb":
        return _damage_lmdb(ctx, kind, url, run_id, effects)
    root = ctx.backend.path(ctx.seed)
    run_file = root / "runs" / f"{run_id}.mwj"
    if kind == "foreign_snapshot":
        source, target = root / "snapshots" / f"{other}.mws", root / "snapshots" / f"{run_id}.mws"
        if not source.exists():
            return "no donor snapshot"
        shutil.copyfile(source, target)
        return f"copied the snapshot of run {other} over run {run_id}'s"
    if not run_file.exists():
        return f"run file {run_file.name} absent (the death came before the run existed)"
    data = run_file.read_bytes()
    frames = frame_offsets(data)
    acked = len(effects.acked.get(run_id, []))
    if kind in ("torn_tail", "short_write"):
        if operation not in ("append", "append_indexed") or len(frames) <= acked:
            return f"nothing unacknowledged in the run file (the death was in {operation})"
        start = frames[acked][0]
        if kind == "short_write":
            last_start, last_end = frames[-1]
            start = last_start + _HEADER.size
            cut = rng.randrange(start, last_end)
        else:
            cut = rng.randrange(start, len(data))
        _truncate(run_file, cut)
        return (
            f"cut {run_file.name} at byte {cut} of {len(data)} (unacknowledged from byte {frames[acked][0]})"
        )
    if not frames:
        return "the run file holds no frame"
    if kind == "length_field":
        start = frames[-1][0]
        grown = _HEADER.unpack_from(data, start)[1] + rng.randint(1, 4096)
        damaged = bytearray(data)
        struct.pack_into(">I", damaged, start + 4, grown)
        _write(run_file, bytes(damaged))
        return f"length field of the last frame (byte {start}) set to {grown}"
    offset = rng.randrange(0, frames[min(acked, len(frames)) - 1][1]) if acked else rng.randrange(len(data))
    bit = rng.randrange(8)
    damaged = bytearray(data)
    damaged[offset] ^= 1 << bit
    _write(run_file, bytes(damaged))
    return f"flipped bit {bit} of byte {offset} of {run_file.name}"


def _damage_lmdb(ctx: SeedContext, kind: str, url: str, run_id: str, effects: EffectLog) -> str:
    rng = ctx.rng
    journal = open_journal(url)
    try:
        faults = FAULT_INJECTION.of(journal)
        if faults is None:
            return "the backend offers no fault injection"
        acked = len(effects.acked.get(run_id, []))
        if kind == "foreign_snapshot":
            if journal.read_snapshot(run_id) is None:
                return "no snapshot to damage"
            faults.corrupt_snapshot(run_id)
            return f"damaged the snapshot of run {run_id}"
        if not acked:
            return "nothing acknowledged to damage"
        sequence = rng.randint(1, acked)
        faults.corrupt_record(run_id, sequence)
        return f"flipped bytes of acknowledged record {sequence} of run {run_id}"
    finally:
        journal.close()


class _FailingDisk:
    """Replaces the file journal's ``os`` for one append: half of the write lands, then the disk fails."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.fired = False
        self.partial = 0
        self._armed = False

    def arm(self) -> None:
        """Make the next ``os.write`` of the file journal fail (called inside the chosen operation)."""
        self._armed = True
        setattr(_local_journal, "os", self)  # noqa: B010 - the module's own name for os, swapped

    def disarm(self) -> None:
        """Give the file journal its real ``os`` back."""
        self._armed = False
        setattr(_local_journal, "os", os)  # noqa: B010

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        """Write half of the first batch, then fail with the errno (once)."""
        if not self._armed:
            return os.write(fd, data)
        if not self.partial and len(data) > 1:
            self.partial = os.write(fd, data[: len(data) // 2])
            return self.partial
        self.fired = True
        self.disarm()
        raise OSError(self.code, os.strerror(self.code))

    def describe(self) -> str:
        """What the disk did."""
        name = errno.errorcode[self.code]
        if not self.fired:
            return f"{name} armed, but the operation wrote nothing to a run file"
        return f"{name} after {self.partial} bytes of a write"


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as handle:
        handle.truncate(size)


def _write(path: Path, data: bytes) -> None:
    with path.open("r+b") as handle:
        handle.write(data)
        handle.truncate(len(data))
