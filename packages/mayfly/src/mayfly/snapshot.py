"""Snapshot contents: a disposable cache of derived state, never the source of truth.

A snapshot holds the serialized :class:`~mayfly.model.state.RunStateRecord`,
the last included sequence, event id and record checksum, and checksums of the
pinned specification and of the state bytes, under an explicit schema version
(ADR-0032 "Journal and snapshot guarantees"). Anything wrong with one — an
unknown version, a checksum mismatch, a state that does not decode, a record
that no longer matches the journal — makes it unusable: the caller discards it
with the diagnostic and rebuilds from events.
"""

from __future__ import annotations

import msgspec

from mayfly.journal import JournalRecord, SnapshotRecord, check_snapshot
from mayfly.model.errors import one_line
from mayfly.model.json import sha256_hex
from mayfly.model.state import STATE_SCHEMA_VERSION, RunState, RunStateRecord, collector_paused

__all__ = ["SNAPSHOT_SCHEMA_VERSION", "make_snapshot", "restore_snapshot"]

SNAPSHOT_SCHEMA_VERSION = 1
"""The snapshot layout this code writes and reads; others are discarded, never guessed at."""

_STATE_DECODER = msgspec.json.Decoder(RunStateRecord)


def make_snapshot(state: RunState, last_record: JournalRecord) -> SnapshotRecord:
    """Snapshot ``state``, which must include exactly the history up to ``last_record``."""
    if last_record.sequence != state.sequence or last_record.run_id != state.run_id:
        raise ValueError(
            f"snapshot of run {state.run_id} at sequence {state.sequence} cannot end at "
            f"record {last_record.run_id}#{last_record.sequence}"
        )
    body = msgspec.json.encode(state.to_record())
    return SnapshotRecord.seal(
        run_id=state.run_id,
        schema_version=SNAPSHOT_SCHEMA_VERSION,
        last_sequence=state.sequence,
        last_event_id=last_record.event_id,
        last_record_checksum=last_record.checksum,
        spec_checksum=state.spec_hash,
        state_checksum="sha256:" + sha256_hex(body),
        state=body,
    )


def restore_snapshot(snapshot: SnapshotRecord, record_at_snapshot: JournalRecord | None) -> RunState | str:
    """The state a snapshot holds, or a one-line diagnostic saying why it must be discarded.

    ``record_at_snapshot`` is the journal's record at ``snapshot.last_sequence``
    (``None`` if the journal does not hold it).
    """
    if snapshot.schema_version != SNAPSHOT_SCHEMA_VERSION:
        return (
            f"snapshot of run {snapshot.run_id} has unknown schema version {snapshot.schema_version} "
            f"(this Mayfly writes {SNAPSHOT_SCHEMA_VERSION})"
        )
    stale = check_snapshot(snapshot, record_at_snapshot)
    if stale is not None:
        return stale
    if "sha256:" + sha256_hex(snapshot.state) != snapshot.state_checksum:
        return f"snapshot of run {snapshot.run_id}: state bytes do not match their checksum"
    with collector_paused():
        return _rebuild(snapshot)


def _rebuild(snapshot: SnapshotRecord) -> RunState | str:
    try:
        record = _STATE_DECODER.decode(snapshot.state)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return f"snapshot of run {snapshot.run_id}: state does not decode ({one_line(str(exc))})"
    except RecursionError:
        return f"snapshot of run {snapshot.run_id}: state does not decode (nested too deeply)"
    if record.schema_version != STATE_SCHEMA_VERSION:
        return f"snapshot of run {snapshot.run_id}: unknown state schema version {record.schema_version}"
    if (
        record.run_id != snapshot.run_id
        or record.sequence != snapshot.last_sequence
        or record.spec_hash != snapshot.spec_checksum
        or not record.spec.matches_hash(record.spec_hash)
    ):
        return f"snapshot of run {snapshot.run_id}: state does not match the snapshot's identity or spec"
    try:
        return RunState.from_record(record)
    except (ValueError, KeyError) as exc:
        return f"snapshot of run {snapshot.run_id}: state is inconsistent ({one_line(str(exc))})"
