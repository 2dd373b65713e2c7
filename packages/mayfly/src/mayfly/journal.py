"""The storage-neutral journal contract: record envelopes, checksums, durability and the Protocol.

A journal stores, per run, an append-only sequence of opaque record envelopes
(ADR-0032 "Journal and snapshot guarantees"). It never interprets an event: the
``payload`` is the encoded event body produced above this layer, and the
journal's job is ordering, atomicity, idempotency, fencing and integrity.

Checksums
---------
Record and snapshot checksums are lowercase hex SHA-256 digests over a
canonical, length-prefixed encoding, so no two different envelopes can encode
to the same bytes::

    digest = SHA-256( DOMAIN || field_1 || field_2 || ... )
    field  = u64 big-endian byte length || bytes

Text fields are their UTF-8 bytes, integers are their shortest decimal ASCII
form (``12``, never ``012``), ``bytes`` fields are used as they are.

* Records: ``DOMAIN = b"mayfly.journal.record/1\\x00"``, fields ``run_id``,
  ``sequence``, ``event_id``, ``event_type``, ``schema_version``, ``payload``.
* Snapshots: ``DOMAIN = b"mayfly.journal.snapshot/1\\x00"``, fields ``run_id``,
  ``schema_version``, ``last_sequence``, ``last_event_id``,
  ``last_record_checksum``, ``spec_checksum``, ``state_checksum``, ``state``.

The test vectors in ``docs/writing-a-backend.md`` pin this encoding.

Input rules (every backend enforces them through :func:`validate_batch`)
-------------------------------------------------------------------------
Run and event ids are canonical UUID strings; ``sequence`` is 1-based and at
most ``2**63 - 1``; ``event_type`` matches ``[A-Za-z][A-Za-z0-9]*`` and is at
most 64 characters; ``schema_version >= 1``; ``payload`` is valid UTF-8 (the
durable encoding is UTF-8 JSON, ADR-0032) and at most :data:`MAX_RECORD_PAYLOAD`
bytes. Bad input raises a typed error and nothing is written.

Optional features
-----------------
Beyond :class:`WorkflowJournal`, a backend may offer features, each a
:class:`JournalCapabilities` flag and a Protocol: :data:`RUN_SUMMARIES`,
:data:`RUN_TAILS`, :data:`RUN_VERIFICATION`, :data:`RUN_PURGE`,
:data:`NETWORK` and :data:`FAULT_INJECTION`. Callers ask ``FEATURE.of(journal)``; a backend's
attributes are never probed. ``mayfly.backend`` is the kit a backend builds
these on.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import re
import struct
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast, final, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import msgspec

from mayfly.model.errors import (
    ChecksumMismatch,
    CompatibilityError,
    ConflictingRecord,
    InvalidRecord,
    LimitExceeded,
    SnapshotCorrupt,
)
from mayfly.model.ids import parse_event_id, parse_run_id

__all__ = [
    "FAULT_INJECTION",
    "MAX_EVENT_TYPE_LENGTH",
    "MAX_RECORD_PAYLOAD",
    "MAX_SEQUENCE",
    "MAX_SNAPSHOT_STATE",
    "MAX_TAILS",
    "NETWORK",
    "OPTIONAL_FEATURES",
    "RUN_PURGE",
    "RUN_SUMMARIES",
    "RUN_TAILS",
    "RUN_VERIFICATION",
    "AppendResult",
    "Durability",
    "Feature",
    "JournalCapabilities",
    "JournalFaults",
    "JournalRecord",
    "NetworkJournal",
    "Relay",
    "RunPurge",
    "RunSummaries",
    "RunSummary",
    "RunTail",
    "RunTails",
    "RunVerification",
    "SnapshotRecord",
    "WorkflowJournal",
    "check_snapshot",
    "redact_url",
    "validate_batch",
    "validate_read",
    "validate_tails",
]

MAX_RECORD_PAYLOAD: Final = 1 << 20
"""Largest accepted record payload, in bytes (1 MiB)."""

MAX_SNAPSHOT_STATE: Final = 64 << 20
"""Largest accepted snapshot state, in bytes (64 MiB)."""

MAX_EVENT_TYPE_LENGTH: Final = 64
"""Longest accepted event type name, in ASCII characters."""

MAX_SEQUENCE: Final = (1 << 63) - 1
"""Largest sequence number (fits a signed 64-bit column in every backend)."""

MAX_TAILS: Final = 1_000
"""The most runs one ``read_tails`` call may name."""

_MAX_CHECKSUM_TEXT = 128
_EVENT_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # as mayfly.model.ids
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]+")
_RECORD_DOMAIN = b"mayfly.journal.record/1\x00"
_SNAPSHOT_DOMAIN = b"mayfly.journal.snapshot/1\x00"
_U64 = struct.Struct(">Q").pack


# Well-formed event type names met so far (bounded: a store could hold any number of names).
_EVENT_TYPES_SEEN: set[str] = set()
_EVENT_TYPES_REMEMBERED = 256

# Records sealed in this process, by identity: appending them needs no second validation.
_SEALED: weakref.WeakValueDictionary[int, JournalRecord] = weakref.WeakValueDictionary()


def _digest(domain: bytes, fields: Iterable[bytes]) -> str:
    parts = [domain]
    for field in fields:
        parts.append(len(field).to_bytes(8, "big"))
        parts.append(field)
    # One hash call over the joined bytes is much cheaper than many small updates.
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _record_digest(  # noqa: PLR0917 - the six record fields, positional on the hot path
    run_id: str, sequence: int, event_id: str, event_type: str, schema_version: int, payload: bytes
) -> str:
    """A record's checksum: :func:`_digest` over its six fields, unrolled (every append seals records)."""
    run = run_id.encode()
    seq = b"%d" % sequence
    event = event_id.encode()
    kind = event_type.encode()
    version = b"%d" % schema_version
    return hashlib.sha256(
        b"".join(
            (
                _RECORD_DOMAIN,
                _U64(len(run)),
                run,
                _U64(len(seq)),
                seq,
                _U64(len(event)),
                event,
                _U64(len(kind)),
                kind,
                _U64(len(version)),
                version,
                _U64(len(payload)),
                payload,
            )
        )
    ).hexdigest()


def _is_int(value: object) -> bool:
    # bool is an int subclass; a True sequence is a type error, not sequence 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(what: str, value: object, low: int, high: int) -> int:
    if not _is_int(value):
        raise InvalidRecord(f"{what} must be an int, got {type(value).__name__}")
    number: int = value  # type: ignore[assignment]  # checked by _is_int
    if not low <= number <= high:
        raise InvalidRecord(f"{what} must be in [{low}, {high}], got {number}")
    return number


def _check_text(what: str, value: object, pattern: re.Pattern[str], max_length: int) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(f"{what} must be a str, got {type(value).__name__}")
    if len(value) > max_length or pattern.fullmatch(value) is None:
        raise InvalidRecord(
            f"{what} {value[:80]!r} must match {pattern.pattern} and be at most {max_length} chars"
        )
    return value


def _check_bytes(what: str, value: object, limit: int, *, utf8: bool) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidRecord(f"{what} must be bytes, got {type(value).__name__}")
    if len(value) > limit:
        raise LimitExceeded(what, limit, len(value))
    if utf8:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRecord(
                f"{what} is not valid UTF-8 at byte {error.start}; encode events as UTF-8 JSON"
            ) from None
    return value


@final
class JournalRecord(msgspec.Struct, frozen=True, kw_only=True, weakref=True):
    """One sealed record envelope: the unit a journal appends, stores and returns.

    Build records with :meth:`seal`, which validates every field and computes
    ``checksum``; a record decoded from storage is checked with :meth:`verify`.
    """

    run_id: str
    sequence: int
    event_id: str
    event_type: str
    schema_version: int
    payload: bytes
    checksum: str

    @classmethod
    def seal(
        cls,
        *,
        run_id: str,
        sequence: int,
        event_id: str,
        event_type: str,
        schema_version: int,
        payload: bytes,
    ) -> JournalRecord:
        """Validate the fields and return the record with its checksum computed."""
        if not _fields_well_formed(run_id, sequence, event_id, event_type, schema_version, payload):
            # The slow path names the broken field with its precise typed error.
            cls(
                run_id=run_id,
                sequence=sequence,
                event_id=event_id,
                event_type=event_type,
                schema_version=schema_version,
                payload=payload,
                checksum="",
            ).validate()
        sealed = cls(
            run_id=run_id,
            sequence=sequence,
            event_id=event_id,
            event_type=event_type,
            schema_version=schema_version,
            payload=payload,
            checksum=_record_digest(run_id, sequence, event_id, event_type, schema_version, payload),
        )
        _SEALED[id(sealed)] = sealed
        return sealed

    def expected_checksum(self) -> str:
        """Return the checksum this record's fields should carry (fields must be well-typed)."""
        return _record_digest(
            self.run_id, self.sequence, self.event_id, self.event_type, self.schema_version, self.payload
        )

    def validate(self) -> None:
        """Raise a typed error if any field breaks the input rules; the checksum is not checked."""
        parse_run_id(self.run_id)
        _check_int("record sequence", self.sequence, 1, MAX_SEQUENCE)
        parse_event_id(self.event_id)
        _check_text("event type", self.event_type, _EVENT_TYPE, MAX_EVENT_TYPE_LENGTH)
        _check_int("record schema_version", self.schema_version, 1, MAX_SEQUENCE)
        _check_bytes("record payload", self.payload, MAX_RECORD_PAYLOAD, utf8=True)
        if not isinstance(self.checksum, str):
            raise InvalidRecord(f"record checksum must be a str, got {type(self.checksum).__name__}")

    def verify(self) -> None:
        """Raise :class:`ChecksumMismatch`, naming run and sequence, if the checksum is wrong."""
        self.validate()
        if self.checksum != self.expected_checksum():
            raise ChecksumMismatch(
                f"record checksum mismatch: run {self.run_id} sequence {self.sequence} "
                f"(event {self.event_id}); the stored record is corrupt, restore it from a replica "
                "or backup"
            )


@final
class SnapshotRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A derived cache of a run's state up to ``last_sequence``; never the source of truth.

    ``state`` is opaque bytes produced above the journal. ``last_event_id`` and
    ``last_record_checksum`` identify the record the snapshot includes last, so
    :func:`check_snapshot` can tell a stale snapshot from a current one.
    """

    run_id: str
    schema_version: int
    last_sequence: int
    last_event_id: str
    last_record_checksum: str
    spec_checksum: str
    state_checksum: str
    state: bytes
    checksum: str

    @classmethod
    def seal(
        cls,
        *,
        run_id: str,
        schema_version: int,
        last_sequence: int,
        last_event_id: str,
        last_record_checksum: str,
        spec_checksum: str,
        state_checksum: str,
        state: bytes,
    ) -> SnapshotRecord:
        """Validate the fields and return the snapshot with its checksum computed."""
        unsealed = cls(
            run_id=run_id,
            schema_version=schema_version,
            last_sequence=last_sequence,
            last_event_id=last_event_id,
            last_record_checksum=last_record_checksum,
            spec_checksum=spec_checksum,
            state_checksum=state_checksum,
            state=state,
            checksum="",
        )
        unsealed.validate()
        return msgspec.structs.replace(unsealed, checksum=unsealed.expected_checksum())

    def validate(self) -> None:
        """Raise :class:`InvalidRecord` (or a limit/id error) if a field breaks the input rules."""
        parse_run_id(self.run_id)
        _check_int("snapshot schema_version", self.schema_version, 1, MAX_SEQUENCE)
        _check_int("snapshot last_sequence", self.last_sequence, 1, MAX_SEQUENCE)
        parse_event_id(self.last_event_id)
        _check_text("snapshot last_record_checksum", self.last_record_checksum, _SHA256_HEX, 64)
        _check_text("snapshot spec_checksum", self.spec_checksum, _PRINTABLE_ASCII, 128)
        _check_text("snapshot state_checksum", self.state_checksum, _PRINTABLE_ASCII, 128)
        _check_bytes("snapshot state", self.state, MAX_SNAPSHOT_STATE, utf8=False)
        if not isinstance(self.checksum, str):
            raise InvalidRecord("snapshot checksum must be a str")

    def expected_checksum(self) -> str:
        """Return the checksum this snapshot's fields should carry (fields must be well-typed)."""
        return _digest(
            _SNAPSHOT_DOMAIN,
            (
                self.run_id.encode(),
                str(self.schema_version).encode(),
                str(self.last_sequence).encode(),
                self.last_event_id.encode(),
                self.last_record_checksum.encode(),
                self.spec_checksum.encode(),
                self.state_checksum.encode(),
                self.state,
            ),
        )

    def verify(self) -> None:
        """Raise :class:`SnapshotCorrupt` if a field is invalid or the checksum does not match."""
        try:
            self.validate()
        except (InvalidRecord, LimitExceeded, ValueError) as error:
            raise SnapshotCorrupt(str(getattr(self, "run_id", "?")), str(error)) from None
        if self.checksum != self.expected_checksum():
            raise SnapshotCorrupt(self.run_id, "checksum mismatch")


@final
class AppendResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a journal acknowledged: the batch as stored and the run's last committed sequence.

    ``already_committed`` is true when the batch was an exact re-append of
    records committed earlier, so nothing new was written.
    """

    run_id: str
    last_sequence: int
    records: tuple[JournalRecord, ...]
    already_committed: bool = False


class Durability(enum.StrEnum):
    """When a backend acknowledges an append, weakest first; each backend declares exactly one.

    A backend never claims more than it can meet: a store that cannot honour
    the level it was configured for raises ``DurabilityUnavailable`` when
    opened instead of acknowledging anything.
    """

    MEMORY = "memory"
    """Nothing survives the process (in-memory reference stores)."""
    WRITE = "write"
    """Handed to the operating system: survives the process dying, not the host."""
    FLUSH = "flush"
    """Userspace (or server) buffers flushed to the operating system: survives the process."""
    DURABLE = "durable"
    """Survives a crash or power loss of the host: fsync, synchronous commit, AOF ``always``."""

    @property
    def rank(self) -> int:
        """Position in the order memory < write < flush < durable."""
        return _DURABILITY_ORDER.index(self)

    def meets(self, required: Durability) -> bool:
        """Whether acknowledging at this level satisfies ``required``."""
        return self.rank >= required.rank


_DURABILITY_ORDER: Final = (
    Durability.MEMORY,
    Durability.WRITE,
    Durability.FLUSH,
    Durability.DURABLE,
)


@final
class JournalCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend declares it supports; the contract suite skips only clauses declared absent.

    ``cross_process``: appends and leases are safe across processes on the
    store. ``fencing``: appends are checked against the lease fencing token.
    ``crash_durable``: an acknowledged record survives the writer process being
    killed. ``fault_injection``: the journal implements :class:`JournalFaults`.
    ``snapshots``: snapshots are stored. ``lease_expiry``: a lease not renewed
    within its ttl can be taken over.

    Optional features, each served by its own Protocol (see :class:`Feature`;
    a flag declared true obliges the journal to implement the Protocol, and
    callers ask through the feature, never by probing attributes):
    ``run_summaries``: :class:`RunSummaries`, an indexed listing of recent runs.
    ``run_tails``: :class:`RunTails`, what inspecting many runs reads (each
    one's snapshot and the records after it) in one read of the store.
    ``run_verification``: :class:`RunVerification`, a full audit of a run's
    stored history beyond what reads check. ``run_purge``: :class:`RunPurge`,
    removal of a run that nobody owns. ``network``: the journal waits on
    sockets and implements :class:`NetworkJournal`, so the contract suite can
    check that those waits never block the hub. ``run_index``: the journal
    keeps the run index workers claim runs from
    (:class:`mayfly.runindex.RunIndexJournal`, feature
    :data:`mayfly.runindex.RUN_INDEX`). ``run_wakeups``: idle workers can wait
    for a run to become claimable instead of polling
    (:class:`mayfly.runindex.RunWakeups`, feature :data:`mayfly.runindex.RUN_WAKEUPS`).
    ``append_wakeups`` (with ``run_wakeups``): an ``append_indexed`` without a
    fencing token whose entry makes the run claimable now wakes the listening
    workers itself, in the same atomic step, so a caller that just created a
    run (:meth:`mayfly.runtime.WorkflowRuntime.start`) sends no separate
    ``notify_wakeups``.
    ``queue_control``: the journal stores queue settings and enforces their
    concurrency and rate limits and deduplication ids in its claims and
    appends (:class:`mayfly.queues.QueueControl`, feature :data:`mayfly.queues.QUEUE_CONTROL`).
    ``schedule_store``: the journal stores durable schedules that every worker
    serves (:class:`mayfly.schedules.ScheduleStore`, feature :data:`mayfly.schedules.SCHEDULE_STORE`).
    """

    durability: Durability
    cross_process: bool
    fencing: bool
    crash_durable: bool
    fault_injection: bool = False
    snapshots: bool = True
    lease_expiry: bool = False
    run_summaries: bool = False
    run_verification: bool = False
    run_tails: bool = False
    run_purge: bool = False
    network: bool = False
    run_index: bool = False
    run_wakeups: bool = False
    append_wakeups: bool = False
    queue_control: bool = False
    schedule_store: bool = False

    @classmethod
    def declare(cls, durability: Durability, *flags: str) -> JournalCapabilities:
        """The capabilities with ``durability`` and exactly the named flags true, every other flag false.

        Flags are named one per argument or several to an argument, separated
        by spaces: ``JournalCapabilities.declare(Durability.DURABLE, "cross_process
        fencing crash_durable snapshots")``. An unknown name raises ``ValueError``.
        """
        names = set(cls.__struct_fields__) - {"durability"}
        flags = tuple(name for group in flags for name in group.split())
        unknown = sorted(set(flags) - names)
        if unknown:
            raise ValueError(
                f"unknown capability flag(s) {', '.join(unknown)}; the flags are {sorted(names)}"
            )
        return cls(durability=durability, **{name: name in flags for name in names})


@runtime_checkable
class WorkflowJournal(Protocol):
    """The per-run, append-only, checksum-verified record store every backend implements."""

    @property
    def url(self) -> str:
        """The URL the journal was opened from, with any password replaced by ``***``."""
        ...

    @property
    def durability(self) -> Durability:
        """The durability level met before :meth:`append` returns."""
        ...

    @property
    def capabilities(self) -> JournalCapabilities:
        """What this backend supports (see :class:`JournalCapabilities`)."""
        ...

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Atomically append ``records`` at ``expected_next`` if that is the run's next sequence.

        The batch must hold sequences ``expected_next, expected_next + 1, ...``
        of ``run_id``. If the journal's next sequence differs, the append
        raises ``AppendConflict`` unless every record is already committed
        byte-identically (then it returns with ``already_committed=True``). A
        batch event id that is already committed as a different record (other
        content or another sequence) raises ``ConflictingRecord``: same
        identity, different fact. Nothing is written on any error.
        ``fence`` must equal the run's current fencing token (``None`` only
        while it is 0), otherwise ``FencingRejected``.
        Returns only after :attr:`durability` is met.
        """
        ...

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Return the run's records with sequence > ``after`` in order, each checksum-verified.

        A missing sequence raises ``JournalGap``; corrupt bytes raise
        ``ChecksumMismatch`` or another ``CorruptionError``. An unknown run
        reads as empty.
        """
        ...

    def next_sequence(self, run_id: str) -> int:
        """Return the sequence the next append must carry (1 for a new run)."""
        ...

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Return up to ``limit`` sorted run ids holding records, all greater than ``after``."""
        ...

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Store ``snapshot`` as the run's snapshot, replacing any earlier one atomically."""
        ...

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """Return the run's snapshot, ``None`` if absent; raise ``SnapshotCorrupt`` if unusable."""
        ...

    def close(self) -> None:
        """Release the store's resources; the journal may not be used afterwards."""
        ...

    def __enter__(self) -> Self:
        """Return the journal itself."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the journal."""
        ...


@runtime_checkable
class JournalFaults(Protocol):
    """Fault injection for the contract suite; implemented when ``capabilities.fault_injection``.

    Each method damages stored data the way a disk or an operator might, so
    the suite can check that reads fail closed. Never call these in production.
    """

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Damage the stored bytes of one record so its checksum no longer matches."""
        ...

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap in the run's sequence."""
        ...

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored bytes of the run's snapshot."""
        ...


@final
class RunSummary(msgspec.Struct, frozen=True):
    """One row of a backend's run index (for ``mayfly runs``): derived data, never used for correctness.

    ``workflow_id`` and ``status`` are what the run's records said when they
    were appended (``None`` when the records carry no run event, such as
    contract-suite probes); ``last_sequence`` is the run's last committed
    sequence.
    """

    run_id: str
    workflow_id: str | None
    status: str | None
    last_sequence: int
    created_at: datetime.datetime
    updated_at: datetime.datetime


@runtime_checkable
class RunSummaries(Protocol):
    """Optional feature ``run_summaries``: the most recently updated runs, served by an index."""

    def run_summaries(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        updated_before: datetime.datetime | None = None,
        limit: int = 100,
    ) -> list[RunSummary]:
        """Return up to ``limit`` runs holding records, newest ``updated_at`` first, optionally filtered.

        Page by passing the last row's ``updated_at`` as ``updated_before``. A
        ``limit`` outside ``[1, 100000]`` or a filter that is not a string
        raises ``InvalidRecord``.
        """
        ...


@final
class RunTail(msgspec.Struct, frozen=True, kw_only=True):
    """What inspecting one run reads: its snapshot, if it has a usable one, and the records from it on.

    With a ``snapshot``, ``records`` start at the snapshot's
    ``last_sequence`` (the record it includes last, which tells a current
    snapshot from a stale one: :func:`check_snapshot`) and run to the run's
    last record; without one they are the whole history (empty for an unknown
    run). ``discarded`` says why a stored snapshot was not usable (corrupt,
    or of another run); the records are then the whole history.
    """

    run_id: str
    snapshot: SnapshotRecord | None
    records: tuple[JournalRecord, ...]
    discarded: str | None = None


@runtime_checkable
class RunTails(Protocol):
    """Optional feature ``run_tails``: many runs' snapshots and tails in one read of the store.

    :func:`mayfly.recovery.inspect_runs` (the console's run list, ``mayfly
    runs``) reads a page of runs through it at the cost of one query where a
    backend has queries, instead of two reads per run.
    """

    def read_tails(self, run_ids: Sequence[str]) -> list[RunTail]:
        """The :class:`RunTail` of each run, in the order given, read in one consistent view of the store.

        Records are checksum-verified and gap-checked as ``read`` does, and a
        damaged history raises the same typed error, naming its run (read the
        runs one at a time to tell the others). More than :data:`MAX_TAILS`
        run ids, a malformed or repeated one, or a ``run_ids`` that is not a
        sequence raise ``InvalidIdentifier`` or ``InvalidRecord``.
        """
        ...


@runtime_checkable
class RunVerification(Protocol):
    """Optional feature ``run_verification``: check every stored byte of one run's history."""

    def verify_run(self, run_id: str) -> int:
        """Verify the run's whole stored history and return its record count (0 for an unknown run).

        Checks what reads do not have to (for example event-id uniqueness over
        the whole history, or bytes after the last record); raises the typed
        ``CorruptionError`` naming the run and where.
        """
        ...


@runtime_checkable
class RunPurge(Protocol):
    """Optional feature ``run_purge``: remove a finished or abandoned run that nobody owns."""

    def purge_run(self, run_id: str) -> bool:
        """Remove the run's records, snapshot and lease grant; return whether it held anything.

        The fencing counter is kept, so tokens granted for the run stay
        monotonic and a late holder of an old lease is still fenced. A run
        whose lease is held raises ``LeaseHeld`` and is left as it was.
        Purging is final: the history is gone, and ``read`` returns nothing.
        """
        ...


Relay = Callable[[str, int], tuple[str, int]]
"""Maps a server's ``(host, port)`` to the ``(host, port)`` a connection should dial instead."""


@runtime_checkable
class NetworkJournal(Protocol):
    """Optional feature ``network``: a journal that talks to a server over sockets.

    The contract suite opens a second journal on the same store through a
    loopback relay that delays every reply, and checks that a short hub timer
    still fires on time while an append waits (clause
    ``journal.hub.never-blocks``).
    """

    def relayed(self, relay: Relay) -> WorkflowJournal:
        """Open another journal on the same store whose every connection dials ``relay(host, port)``.

        ``relay`` is called with each server address the journal would
        connect to (every node of a cluster too), and returns where to connect
        instead. The caller closes the returned journal.
        """
        ...


_P = TypeVar("_P")


@final
class Feature(Generic[_P]):
    """An optional journal feature: a :class:`JournalCapabilities` flag and the Protocol serving it.

    Ask a journal for a feature with :meth:`of`, never by probing its
    attributes: a backend that does not declare the flag does not offer the
    feature, whatever methods it happens to have::

        summaries = RUN_SUMMARIES.of(journal)
        if summaries is not None:
            rows = summaries.run_summaries(limit=20)
    """

    __slots__ = ("flag", "protocol")

    def __init__(self, flag: str, protocol: Any) -> None:
        if flag not in JournalCapabilities.__struct_fields__:
            raise ValueError(f"{flag!r} is not a JournalCapabilities flag")
        self.flag = flag
        self.protocol: type[Any] = protocol

    def declared(self, journal: WorkflowJournal) -> bool:
        """Whether ``journal`` declares the feature in its capabilities."""
        return bool(getattr(journal.capabilities, self.flag))

    def of(self, journal: WorkflowJournal) -> _P | None:
        """Return ``journal`` as the feature's Protocol if it declares the flag, else ``None``.

        A journal that declares the flag but does not implement the Protocol
        raises ``CompatibilityError``: the declaration is the promise.
        """
        if not self.declared(journal):
            return None
        if not isinstance(journal, self.protocol):
            raise CompatibilityError(
                f"{type(journal).__qualname__} ({journal.url}) declares {self.flag}=True but does not "
                f"implement {self.protocol.__qualname__}; fix the backend's capabilities"
            )
        return cast(_P, journal)

    def __repr__(self) -> str:
        return f"Feature({self.flag!r}, {self.protocol.__qualname__})"


FAULT_INJECTION: Final[Feature[JournalFaults]] = Feature("fault_injection", JournalFaults)
"""Damage stored data on purpose (contract suite only)."""
RUN_SUMMARIES: Final[Feature[RunSummaries]] = Feature("run_summaries", RunSummaries)
"""An indexed listing of the most recently updated runs."""
RUN_TAILS: Final[Feature[RunTails]] = Feature("run_tails", RunTails)
"""Many runs' snapshots and the records after them, in one read (a page of a run list)."""
RUN_VERIFICATION: Final[Feature[RunVerification]] = Feature("run_verification", RunVerification)
"""A full audit of one run's stored history."""
RUN_PURGE: Final[Feature[RunPurge]] = Feature("run_purge", RunPurge)
"""Removal of a run nobody owns."""
NETWORK: Final[Feature[NetworkJournal]] = Feature("network", NetworkJournal)
"""Journals that wait on sockets, and can be relayed for the hub-blocking clause."""
OPTIONAL_FEATURES: Final = (FAULT_INJECTION, RUN_SUMMARIES, RUN_TAILS, RUN_VERIFICATION, RUN_PURGE, NETWORK)
"""Every optional feature a backend may declare."""


def validate_batch(
    run_id: object, expected_next: object, records: object, fence: object
) -> tuple[JournalRecord, ...]:
    """Check an append's arguments against the input rules; return the batch as a tuple.

    Raises ``InvalidIdentifier``, ``InvalidRecord`` or ``LimitExceeded`` for
    malformed input, ``ChecksumMismatch`` for a record whose checksum does not
    match its fields and ``ConflictingRecord`` for an event id repeated inside
    the batch. Backends call it before touching the store.
    """
    run = parse_run_id(run_id)
    first = _check_int("expected_next", expected_next, 1, MAX_SEQUENCE)
    if fence is not None:
        _check_int("fence", fence, 0, MAX_SEQUENCE)
    if isinstance(records, str | bytes) or not isinstance(records, Sequence):
        raise InvalidRecord(f"records must be a sequence of JournalRecord, got {type(records).__name__}")
    batch = tuple(records)
    if not batch:
        raise InvalidRecord(f"append to run {run} needs at least one record")
    seen: dict[str, int] = {}
    for offset, record in enumerate(batch):
        if not isinstance(record, JournalRecord):
            raise InvalidRecord(f"records[{offset}] must be a JournalRecord, got {type(record).__name__}")
        if _SEALED.get(id(record)) is record:
            # Validated and checksummed by seal() in this process; the struct is immutable.
            if record.run_id != run or record.sequence != first + offset:
                record.validate()
            elif record.event_id in seen:
                raise ConflictingRecord(
                    f"append rejected: run {run} batch repeats event id {record.event_id} at "
                    f"sequences {seen[record.event_id]} and {record.sequence}"
                )
            else:
                seen[record.event_id] = record.sequence
                continue
        if not _well_formed(record, run):
            record.validate()  # raises the precise typed error
        if record.run_id != run:
            raise InvalidRecord(
                f"records[{offset}] belongs to run {record.run_id}, not {run}; a batch appends to one run"
            )
        if record.sequence != first + offset:
            raise InvalidRecord(
                f"records[{offset}] of run {run} has sequence {record.sequence}, expected "
                f"{first + offset}: a batch holds consecutive sequences from expected_next"
            )
        if record.checksum != record.expected_checksum():
            record.verify()  # raises ChecksumMismatch naming run and sequence
        if record.event_id in seen:
            raise ConflictingRecord(
                f"append rejected: run {run} batch repeats event id {record.event_id} at "
                f"sequences {seen[record.event_id]} and {record.sequence}"
            )
        seen[record.event_id] = record.sequence
    return batch


def _well_formed(record: JournalRecord, run: str) -> bool:
    """Fast path of :meth:`JournalRecord.validate` for the common, valid case (appends are hot)."""
    return (
        record.run_id == run
        and type(record.checksum) is str
        and _fields_well_formed(
            run,
            record.sequence,
            record.event_id,
            record.event_type,
            record.schema_version,
            record.payload,
            run_checked=True,
        )
    )


def _fields_well_formed(  # noqa: PLR0917 - a record's six fields, checked where they are hot
    run_id: object,
    sequence: object,
    event_id: object,
    event_type: object,
    schema_version: object,
    payload: object,
    *,
    run_checked: bool = False,
) -> bool:
    """Whether a record's fields keep every input rule (False: :meth:`JournalRecord.validate` says which)."""
    return (
        (run_checked or (type(run_id) is str and _UUID.fullmatch(run_id) is not None))
        and type(sequence) is int
        and 1 <= sequence <= MAX_SEQUENCE
        and type(schema_version) is int
        and 1 <= schema_version <= MAX_SEQUENCE
        and type(event_id) is str
        and _UUID.fullmatch(event_id) is not None
        and type(event_type) is str
        and (event_type in _EVENT_TYPES_SEEN or _new_event_type(event_type))
        and type(payload) is bytes
        and len(payload) <= MAX_RECORD_PAYLOAD
        and (payload.isascii() or _is_utf8(payload))
    )


def _new_event_type(event_type: str) -> bool:
    """Check an event type name not seen yet; remember a well-formed one (a handful exist)."""
    if len(event_type) > MAX_EVENT_TYPE_LENGTH or _EVENT_TYPE.fullmatch(event_type) is None:
        return False
    if len(_EVENT_TYPES_SEEN) < _EVENT_TYPES_REMEMBERED:
        _EVENT_TYPES_SEEN.add(event_type)
    return True


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def validate_read(run_id: object, after: object, limit: object) -> tuple[str, int, int | None]:
    """Check a read's arguments; return them normalised or raise a typed error."""
    run = parse_run_id(run_id)
    start = _check_int("after", after, 0, MAX_SEQUENCE)
    if limit is None:
        return run, start, None
    return run, start, _check_int("limit", limit, 0, MAX_SEQUENCE)


def validate_tails(run_ids: object) -> tuple[str, ...]:
    """Check ``read_tails``'s run ids: a sequence of at most :data:`MAX_TAILS` distinct canonical ids."""
    if isinstance(run_ids, str | bytes) or not isinstance(run_ids, Sequence):
        raise InvalidRecord(f"run_ids must be a sequence of run ids, got {type(run_ids).__name__}")
    if len(run_ids) > MAX_TAILS:
        raise InvalidRecord(f"read_tails names {len(run_ids)} runs, more than the {MAX_TAILS} allowed")
    runs = tuple(parse_run_id(run_id) for run_id in run_ids)
    if len(set(runs)) != len(runs):
        repeated = next(run for run in runs if runs.count(run) > 1)
        raise InvalidRecord(f"read_tails names run {repeated} more than once")
    return runs


def check_snapshot(snapshot: SnapshotRecord, record: JournalRecord | None) -> str | None:
    """Return why ``snapshot`` cannot be used with the journal, or ``None`` if it matches.

    ``record`` is the journal's record at ``snapshot.last_sequence`` (``None``
    if the journal has no such record). A snapshot whose last event id or
    record checksum differs from the journal's is stale: discard it with this
    diagnostic and rebuild from events. A snapshot *ahead* of the journal is
    diagnosed too, but it is not merely stale: it proves that acknowledged
    records are missing, and recovery fails closed on it
    (:class:`~mayfly.model.errors.HistoryLost`).
    """
    if record is None:
        return (
            f"snapshot of run {snapshot.run_id} includes sequence {snapshot.last_sequence}, "
            "which the journal does not hold"
        )
    if record.event_id != snapshot.last_event_id or record.checksum != snapshot.last_record_checksum:
        return (
            f"snapshot of run {snapshot.run_id} at sequence {snapshot.last_sequence} names event "
            f"{snapshot.last_event_id}, but the journal holds event {record.event_id} "
            f"with a different checksum there"
            if record.event_id != snapshot.last_event_id
            else f"snapshot of run {snapshot.run_id} at sequence {snapshot.last_sequence} "
            "records a checksum that differs from the journal's record"
        )
    return None


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe for logs and reports)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    # Everything after the last "@" of the authority is host and port, kept as
    # written: a malformed port is the URL parser's to report, not a reason to fail here.
    netloc = f"{user}:***@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
