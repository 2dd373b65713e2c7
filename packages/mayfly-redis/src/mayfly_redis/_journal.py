"""``RedisJournal``: per-run record lists, compare-and-append in one Lua script, fenced by leases.

A record is stored as one list element, its envelope fields on one line each
and the payload last (payloads are UTF-8 and may contain newlines, so the
payload is whatever follows the fifth newline)::

    <sequence>\\n<event_id>\\n<event_type>\\n<schema_version>\\n<checksum>\\n<payload>

Reads check that element ``i`` holds sequence ``after + 1 + i`` (a hole raises
``JournalGap``) and verify every checksum (``ChecksumMismatch``), which covers
every field of the element and the run id of the key it was read under; the
numbers must be canonical decimals, so no byte of an element goes unchecked.
The ids hash gains one field per appended record, so its length, read in the
same script as the window, finds a record missing at the end of the list too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, Self, final

import msgspec

from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
    validate_batch,
    validate_read,
)
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    ConflictingRecord,
    CorruptionError,
    FencingRejected,
    InvalidRecord,
    JournalGap,
    LimitExceeded,
    SnapshotCorrupt,
)
from mayfly.model.ids import parse_run_id
from mayfly_redis import _scripts
from mayfly_redis._client import RedisStore, open_store
from mayfly_redis._url import RedisDurability

__all__ = ["RedisJournal", "decode_element", "encode_element", "verified"]

_MAX_LIST_LIMIT: Final = 100_000
_LEX_MAX: Final = b"+"
_DECIMAL: Final = re.compile(rb"[1-9][0-9]{0,18}")


def encode_element(record: JournalRecord) -> bytes:
    """Return the stored list element of ``record``."""
    head = (
        f"{record.sequence}\n{record.event_id}\n{record.event_type}\n"
        f"{record.schema_version}\n{record.checksum}\n"
    )
    return head.encode() + record.payload


def decode_element(run_id: str, element: bytes, position: int | None = None) -> JournalRecord:
    """Return the record stored as ``element``; raise ``ChecksumMismatch`` if it is unreadable.

    ``position`` is the sequence the element is read as, for the message. The
    record is not verified here (see :func:`verified`).
    """
    parts = element.split(b"\n", 5)
    try:
        if len(parts) != 6:
            raise ValueError(f"{len(parts)} fields instead of 6")
        sequence, event_id, event_type, version, checksum, payload = parts
        for name, number in (("sequence", sequence), ("schema version", version)):
            # int() would also take b"03", b" 3" or b"3_0"; the checksum covers only str(int).
            if _DECIMAL.fullmatch(number) is None:
                raise ValueError(f"{name} field {number[:24]!r} is not a canonical decimal")
        return JournalRecord(
            run_id=run_id,
            sequence=int(sequence),
            event_id=event_id.decode(),
            event_type=event_type.decode(),
            schema_version=int(version),
            payload=payload,
            checksum=checksum.decode(),
        )
    except (ValueError, UnicodeDecodeError) as error:
        at = "" if position is None else f" sequence {position}"
        raise ChecksumMismatch(
            f"unreadable record of run {run_id}{at} ({error}); the stored record is corrupt, restore "
            "it from a replica or backup"
        ) from None


def verified(run_id: str, record: JournalRecord) -> JournalRecord:
    """Return ``record`` verified; any damage raises ``ChecksumMismatch`` naming run and sequence."""
    try:
        record.verify()
    except ChecksumMismatch:
        raise
    except ValueError as error:  # InvalidRecord, InvalidIdentifier, LimitExceeded: a damaged field
        raise ChecksumMismatch(
            f"record of run {run_id} sequence {record.sequence} is damaged ({error}); the stored "
            "record is corrupt, restore it from a replica or backup"
        ) from None
    return record


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@final
class RedisJournal:
    """The ``redis://`` journal: a list per run, CAS, dedup and fencing checked in one Lua script.

    ``durability=aof`` (the default) opens only against servers with
    ``appendonly yes`` and ``appendfsync always`` and is ``durable``;
    ``durability=memory`` is ``memory``: a server restart may lose acknowledged
    records.
    """

    def __init__(self, url: str, *, store: RedisStore | None = None) -> None:
        self._store = store if store is not None else open_store(url)
        target = self._store.target
        self._target = target
        self._durability = (
            Durability.DURABLE if target.durability is RedisDurability.AOF else Durability.MEMORY
        )

    @property
    def url(self) -> str:
        """The URL the journal was opened from, password redacted."""
        return self._target.url

    @property
    def durability(self) -> Durability:
        """``durable`` for ``durability=aof``, ``memory`` for ``durability=memory``."""
        return self._durability

    @property
    def capabilities(self) -> JournalCapabilities:
        """Cross-process, fenced, expiring leases, fault injection; crash-durable only with AOF.

        In ``memory`` mode a writer killed after an acknowledgement loses nothing
        either, but the contract ties ``crash_durable`` to a durability of at
        least ``write``, which a non-persistent server does not meet.
        """
        return JournalCapabilities(
            durability=self._durability,
            cross_process=True,
            fencing=True,
            crash_durable=self._durability is Durability.DURABLE,
            fault_injection=True,
            snapshots=True,
            lease_expiry=True,
        )

    @property
    def cluster(self) -> bool:
        """Whether the server is a Redis Cluster."""
        return self._store.cluster

    @property
    def persistence(self) -> str:
        """The persistence settings found on the server(s) when the journal was opened."""
        return self._store.persistence

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Compare-and-append an atomic batch under the run's current fencing token."""
        batch = validate_batch(run_id, expected_next, records, fence)
        target = self._target
        keys = [target.key(run_id, "records"), target.key(run_id, "ids"), target.key(run_id, "fence")]
        if self._store.cluster:
            if expected_next == 1:
                # The index lives in another slot; add it first, so an acknowledged run is
                # always listed (list_runs skips entries whose run holds no records).
                self._store.call("append", "ZADD", target.runs_key, 0, run_id)
        else:
            keys.append(target.runs_key)
        args: list[Any] = ["" if fence is None else str(fence), str(expected_next), len(batch), run_id]
        args += [encode_element(record) for record in batch]
        reply = self._store.script(f"append to run {run_id}", _scripts.APPEND, keys, args)
        status = _text(reply[0])
        if status == "ok":
            return AppendResult(run_id=run_id, last_sequence=batch[-1].sequence, records=batch)
        if status == "replay":
            return AppendResult(
                run_id=run_id, last_sequence=batch[-1].sequence, records=batch, already_committed=True
            )
        if status == "fence":
            raise FencingRejected(run_id, 0 if fence is None else fence, int(reply[1]))
        if status == "cas":
            raise AppendConflict(run_id, expected_next, int(reply[1]))
        if status == "conflict":
            committed = _text(reply[2]).split(" ", 1)[0]
            raise ConflictingRecord(
                f"append rejected: run {run_id} event id {_text(reply[1])} is already committed at "
                f"sequence {committed} with other content"
            )
        if status == "damaged":
            sequence = int(reply[1])
            # The event-id index names the batch, the element at ``sequence`` differs: a damaged
            # element raises ChecksumMismatch (or JournalGap) here, naming run and sequence.
            self.read(run_id, after=sequence - 1, limit=1)
            raise CorruptionError(
                f"append rejected: run {run_id} event-id index holds the batch, but the record stored "
                f"at sequence {sequence} differs from it; the index is damaged, inspect the run"
            )
        if status == "corrupt":
            raise CorruptionError(f"append rejected: run {run_id} is corrupt: {_text(reply[1])}")
        raise CorruptionError(f"append to run {run_id}: unexpected script reply {reply!r}")

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Records after ``after`` in order, each verified; a missing sequence raises JournalGap.

        The window and the number of records ever appended come from one
        script, so a record missing at the end of the run is a gap too.
        """
        run, start, count = validate_read(run_id, after, limit)
        if count == 0:
            return []
        stop = -1 if count is None or start + count - 1 >= (1 << 62) else start + count - 1
        target = self._target
        appended, elements = self._store.script(
            f"read run {run}",
            _scripts.READ,
            [target.key(run, "records"), target.key(run, "ids")],
            [start, stop],
        )
        appended = int(appended)
        records: list[JournalRecord] = []
        expected = start + 1
        for element in elements:
            record = decode_element(run, element, expected)
            if record.sequence != expected:
                raise JournalGap(
                    f"journal gap in run {run}: expected sequence {expected}, found {record.sequence}; "
                    "the store lost records, restore them from a replica or backup"
                )
            if record.sequence > appended:
                raise CorruptionError(
                    f"run {run} holds sequence {record.sequence} but its event-id index counts "
                    f"{appended} appended records; the keys disagree, restore them from a replica or backup"
                )
            records.append(verified(run, record))
            expected += 1
        wanted_end = appended + 1 if count is None else min(appended + 1, start + 1 + count)
        if expected < wanted_end:
            raise JournalGap(
                f"journal gap in run {run}: expected sequence {expected}, found none ({appended} records "
                "were appended); the store lost records, restore them from a replica or backup"
            )
        return records

    def next_sequence(self, run_id: str) -> int:
        """The sequence the next append must carry (1 for a new run)."""
        run = parse_run_id(run_id)
        length = self._store.call(f"next sequence of run {run}", "LLEN", self._target.key(run, "records"))
        return int(length) + 1

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Up to ``limit`` sorted run ids holding records, all greater than ``after`` (no KEYS/SCAN)."""
        start = b"-" if after is None else b"(" + parse_run_id(after).encode()
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIST_LIMIT:
            raise InvalidRecord(f"list_runs limit must be an int in [1, {_MAX_LIST_LIMIT}], got {limit!r}")
        runs: list[str] = []
        while len(runs) < limit:
            page = [
                _text(run)
                for run in self._store.call(
                    "list runs",
                    "ZRANGEBYLEX",
                    self._target.runs_key,
                    start,
                    _LEX_MAX,
                    "LIMIT",
                    0,
                    limit - len(runs),
                )
            ]
            if not page:
                break
            runs += self._holding_records(page) if self._store.cluster else page
            start = b"(" + page[-1].encode()
        return runs

    def _holding_records(self, runs: list[str]) -> list[str]:
        # Cluster only: an index entry is written before its run's first append, which may have failed.
        return [
            run
            for run in runs
            if int(self._store.call("list runs", "EXISTS", self._target.key(run, "records")))
        ]

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Store the run's snapshot, replacing any earlier one (one SET)."""
        run = parse_run_id(run_id)
        if not isinstance(snapshot, SnapshotRecord):
            raise InvalidRecord(f"snapshot must be a SnapshotRecord, got {type(snapshot).__name__}")
        snapshot.validate()
        if snapshot.run_id != run:
            raise InvalidRecord(f"snapshot of run {snapshot.run_id} cannot be stored as run {run}'s")
        if snapshot.checksum != snapshot.expected_checksum():
            raise InvalidRecord(f"snapshot of run {run} fails its checksum; reseal it")
        body = msgspec.json.encode(snapshot)
        self._store.call(f"write snapshot of run {run}", "SET", self._target.key(run, "snapshot"), body)

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """The run's snapshot, ``None`` if absent; ``SnapshotCorrupt`` if unusable."""
        run = parse_run_id(run_id)
        body = self._store.call(f"read snapshot of run {run}", "GET", self._target.key(run, "snapshot"))
        if body is None:
            return None
        try:
            snapshot = msgspec.json.decode(body, type=SnapshotRecord)
        except (msgspec.DecodeError, LimitExceeded) as error:
            raise SnapshotCorrupt(run, f"unreadable: {error}") from None
        snapshot.verify()
        if snapshot.run_id != run:
            raise SnapshotCorrupt(run, f"the key holds the snapshot of run {snapshot.run_id}")
        return snapshot

    # -- fault injection for the contract suite (capabilities.fault_injection) -----------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Change one stored payload without updating its checksum."""
        run = parse_run_id(run_id)
        key = self._target.key(run, "records")
        element = self._store.call("corrupt record", "LINDEX", key, sequence - 1)
        if element is not None:
            damaged = bytes(element) + b" "  # still UTF-8, no longer the checksummed payload
            self._store.call("corrupt record", "LSET", key, sequence - 1, damaged)

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap."""
        run = parse_run_id(run_id)
        key = self._target.key(run, "records")
        self._store.call("remove record", "LSET", key, sequence - 1, b"__removed__")
        self._store.call("remove record", "LREM", key, 1, b"__removed__")

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored snapshot body."""
        run = parse_run_id(run_id)
        key = self._target.key(run, "snapshot")
        self._store.call("corrupt snapshot", "SETRANGE", key, 0, b'{"run_id": 7')

    def close(self) -> None:
        """Close the connection pool."""
        self._store.close()

    def __enter__(self) -> Self:
        """Return the journal."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the journal."""
        self.close()
