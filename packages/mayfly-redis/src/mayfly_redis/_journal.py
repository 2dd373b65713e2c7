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
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import msgspec

from mayfly.backend import JournalBase, decode_snapshot, encode_snapshot
from mayfly.errors import (
    AppendConflict,
    ChecksumMismatch,
    CompatibilityError,
    ConflictingRecord,
    CorruptionError,
    DuplicateRun,
    FencingRejected,
    InvalidRecord,
    LeaseHeld,
)
from mayfly.ids import parse_run_id
from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    Relay,
    SnapshotRecord,
    WorkflowJournal,
)
from mayfly.lease import RecoveryLeaseGuard, validate_acquire
from mayfly.queues import QueueSettings, QueueUsage, check_held
from mayfly.queues import check_queue_name as _check_queue
from mayfly.runindex import IndexEntry, check_claim
from mayfly_redis import _index, _scripts
from mayfly_redis._client import RedisStore, open_store, relayed_store
from mayfly_redis._layout import LayoutKind
from mayfly_redis._lease import RedisLeaseStore
from mayfly_redis._schedules import RedisSchedules
from mayfly_redis._url import RedisDurability
from mayfly_redis._wakeups import RedisWakeupListener

__all__ = ["RedisJournal", "decode_element", "encode_element"]

_REMEDY: Final = "restore the run's keys from a replica or backup"
_LEX_MAX: Final = b"+"
_DECIMAL: Final = re.compile(rb"[1-9][0-9]{0,18}")
# A grant is trusted to be the run's only one until this long before its lease would run out.
_ANY_RUN: Final = "00000000-0000-7000-8000-000000000000"  # stands in for the run when checking an owner
# The run index and its features on each layout: a sharded Cluster store keeps the index but cannot
# enforce a queue's limits across shards (mayfly_redis._layout); an unsharded one keeps no index.
_FEATURES: Final = {
    LayoutKind.STANDALONE: "run_index run_wakeups append_wakeups queue_control",
    LayoutKind.SHARDED: "run_index run_wakeups append_wakeups",
    LayoutKind.UNSHARDED: "",
}


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
        raise ChecksumMismatch(f"unreadable record of run {run_id}{at} ({error}); {_REMEDY}") from None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@final
class RedisJournal(RedisSchedules, JournalBase):
    """The ``redis://`` journal: a list per run, CAS, dedup and fencing checked in one Lua script.

    ``durability=aof`` (the default) opens only against servers with
    ``appendonly yes`` and ``appendfsync always`` and is ``durable``;
    ``durability=memory`` is ``memory``: a server restart may lose acknowledged
    records. Declares cross-process, fenced, expiring leases, fault injection,
    run purging and ``network``; crash-durable only with AOF: in ``memory``
    mode a writer killed after an acknowledgement loses nothing either, but the
    contract ties ``crash_durable`` to a durability of at least ``write``,
    which a non-persistent server does not meet. It also keeps the run index
    (``run_index``, ``run_wakeups``; sharded over slots on a Cluster, see
    :mod:`mayfly_redis._layout`), its append script publishes the wake-up of a
    run it makes claimable (``append_wakeups``), and, on a standalone server, enforces queue
    settings in its claims (``queue_control``; see :mod:`mayfly_redis._index`).
    """

    remedy = _REMEDY

    cluster: bool
    """Whether the server is a Redis Cluster."""
    persistence: str
    """The persistence settings found on the server(s) when the journal was opened."""

    def __init__(self, url: str, *, store: RedisStore | None = None) -> None:
        self._store = store if store is not None else open_store(url)
        self.cluster, self.persistence = self._store.cluster, self._store.persistence
        target = self._store.target
        self._target = target
        durability = Durability.DURABLE if target.durability is RedisDurability.AOF else Durability.MEMORY
        super().__init__(
            url=target.url,
            capabilities=JournalCapabilities.declare(
                durability,
                "cross_process fencing fault_injection snapshots lease_expiry run_purge network",
                "crash_durable" if durability is Durability.DURABLE else "",
                _FEATURES[self._store.layout.kind],
                # Stored schedules (mayfly_redis._schedules) wherever workers can serve them.
                "" if self._store.layout.kind is LayoutKind.UNSHARDED else "schedule_store",
            ),
        )
        self._layout = self._store.layout
        # Scripts as they run on this layout (on a sharded Cluster store they build shard keys).
        self._lua: Callable[[str], str] = lambda source: _scripts.for_layout(source, self._layout.sharded)
        # Claims grant leases through a lease store on the same connections (guards renew and release
        # like those of RedisLeaseStore.acquire); closing the journal releases what it still holds.
        self._leases = RedisLeaseStore(target.url, store=self._store)
        self._channel = f"{target.prefix}:wakeups:{target.db}"
        # run -> (next sequence, fence, monotonic time until which that fence's lease is surely live)

    def relayed(self, relay: Relay) -> WorkflowJournal:
        """Open another journal on the same keys whose connections (to every node) dial ``relay``."""
        return RedisJournal(self.url, store=relayed_store(self._target, relay))

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        layout = self._layout
        keys = [layout.key(run_id, "records"), layout.key(run_id, "ids"), layout.key(run_id, "fence")]
        if layout.kind is LayoutKind.UNSHARDED:
            if expected_next == 1:
                # The index lives in another slot; add it first, so an acknowledged run is
                # always listed (list_runs skips entries whose run holds no records).
                self._store.call("append", "ZADD", layout.runs_key(layout.prefix), 0, run_id)
        else:
            keys.append(layout.runs_key(layout.run_base(run_id)))
        args: list[Any] = ["" if fence is None else str(fence), str(expected_next), len(batch), run_id]
        args += [encode_element(record) for record in batch]
        reply = self._store.script(f"append to run {run_id}", _scripts.APPEND, keys, args)
        return self._answer(run_id, expected_next, batch, fence, reply)

    def _answer(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None, reply: Any
    ) -> AppendResult:
        """The result of an append script's reply: acknowledged, an exact replay, or the typed refusal."""
        status = _text(reply[0])
        if status == "ok":
            return self.acknowledged(run_id, batch)
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
                f"append rejected: run {run_id} event id {_text(reply[1])} is already committed "
                f"at sequence {committed} with other content"
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

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        """Append and store the run's entry in one script: one round trip.

        ``entry()`` changes nothing (see
        :meth:`mayfly.runindex.RunIndexJournal.append_indexed`), so it is asked
        for before the script is sent; the script runs every check first, and
        a refusal stores nothing.
        """
        layout = self._layout
        base = layout.run_base(run_id)
        keys = [
            layout.key(run_id, "records"),
            layout.key(run_id, "ids"),
            layout.key(run_id, "fence"),
            layout.runs_key(base),
            layout.key(run_id, "lease"),
            layout.key(run_id, "index"),
        ]
        head: list[Any] = ["" if fence is None else str(fence), str(expected_next), len(batch), run_id]
        elements = [encode_element(record) for record in batch]
        fields = self._fields(entry())
        args = [*head, "write", base, self._channel, *fields, *elements]
        reply = self._store.script(f"append to run {run_id}", self._lua(_scripts.APPEND_INDEXED), keys, args)
        if _text(reply[0]) != "ok":
            if _text(reply[0]) == "duplicate":
                raise DuplicateRun(run_id, fields[0], fields[8], _text(reply[1]))
            return self._answer(run_id, expected_next, batch, fence, reply)
        return self.acknowledged(run_id, batch)

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        """Records after ``after`` in order, each verified, against the number ever appended.

        The window and the number of records ever appended (the event-id
        index) come from one script, so a record missing at the end of the
        run is a gap too.
        """
        stop = -1 if limit is None or after + limit - 1 >= (1 << 62) else after + limit - 1
        layout = self._layout
        appended, elements = self._store.script(
            f"read run {run_id}",
            _scripts.READ,
            [layout.key(run_id, "records"), layout.key(run_id, "ids")],
            [after, stop],
        )
        stored = (decode_element(run_id, element, after + 1 + i) for i, element in enumerate(elements))
        return self.window(
            run_id,
            after,
            limit,
            ((record.sequence, record) for record in stored),
            lambda _, record: self.verified(record),
            next_sequence=int(appended) + 1,
        )

    def _next_sequence(self, run_id: str) -> int:
        run = run_id
        length = self._store.call(f"next sequence of run {run}", "LLEN", self._layout.key(run, "records"))
        return int(length) + 1

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        """Page the run listing with ZRANGEBYLEX (no KEYS or SCAN); a sharded store merges its shards'."""
        layout = self._layout
        if layout.sharded:
            merged: list[str] = []
            for base in layout.bases:
                merged += self._list_shard(layout.runs_key(base), after, limit, filtered=False)
            return sorted(merged)[:limit]
        unsharded = layout.kind is LayoutKind.UNSHARDED
        return self._list_shard(layout.runs_key(layout.prefix), after, limit, filtered=unsharded)

    def _list_shard(self, key: str, after: str | None, limit: int, *, filtered: bool) -> list[str]:
        start = b"-" if after is None else b"(" + after.encode()
        runs: list[str] = []
        while len(runs) < limit:
            page = [
                _text(run)
                for run in self._store.call(
                    "list runs", "ZRANGEBYLEX", key, start, _LEX_MAX, "LIMIT", 0, limit - len(runs)
                )
            ]
            if not page:
                break
            runs += self._holding_records(page) if filtered else page
            start = b"(" + page[-1].encode()
        return runs

    def _holding_records(self, runs: list[str]) -> list[str]:
        # Unsharded Cluster stores only: the listing entry is written before the run's first append,
        # which may have failed.
        return [
            run
            for run in runs
            if int(self._store.call("list runs", "EXISTS", self._layout.key(run, "records")))
        ]

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        key = self._layout.key(run_id, "snapshot")
        self._store.raw_call(f"write snapshot of run {run_id}", "SET", key, encode_snapshot(snapshot))

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        body = self._store.raw_call(
            f"read snapshot of run {run_id}", "GET", self._layout.key(run_id, "snapshot")
        )
        return None if body is None else decode_snapshot(run_id, body)

    def _close(self) -> None:
        try:
            self._leases.close()  # releases the leases claims granted that are still held
        finally:
            self._store.close()

    # -- purging (capabilities.run_purge) --------------------------------------------------------

    def purge_run(self, run_id: str) -> bool:
        """Delete the run's records, event ids, snapshot, lease and index entry in one script; keep the fence.

        A live lease raises ``LeaseHeld`` and nothing changes. The run's
        listing entry goes last (on an unsharded Cluster store it lives in
        another slot), so a run whose purge was interrupted is still listed,
        never half-hidden.
        """
        run = self.open_run(run_id, "purge")
        layout = self._layout
        keys = [layout.key(run, name) for name in ("lease", "records", "ids", "snapshot", "index")]
        base = layout.run_base(run) if layout.indexed else ""
        status, detail = self._store.script(f"purge run {run}", self._lua(_scripts.PURGE), keys, [base, run])
        if _text(status) == "held":
            raise LeaseHeld(run, _text(detail).split(" ", 2)[-1])
        self._store.call(f"purge run {run}", "ZREM", layout.runs_key(layout.run_base(run)), run)
        return bool(int(detail))

    # -- fault injection for the contract suite (capabilities.fault_injection) -----------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Change one stored payload without updating its checksum."""
        run = self.open_run(run_id, "fault injection")
        key = self._layout.key(run, "records")
        element = self._store.call("corrupt record", "LINDEX", key, sequence - 1)
        if element is not None:
            damaged = bytes(element) + b" "  # still UTF-8, no longer the checksummed payload
            self._store.call("corrupt record", "LSET", key, sequence - 1, damaged)

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete one stored record, leaving a gap."""
        run = self.open_run(run_id, "fault injection")
        key = self._layout.key(run, "records")
        self._store.call("remove record", "LSET", key, sequence - 1, b"__removed__")
        self._store.call("remove record", "LREM", key, 1, b"__removed__")

    def corrupt_snapshot(self, run_id: str) -> None:
        """Damage the stored snapshot body."""
        run = self.open_run(run_id, "fault injection")
        key = self._layout.key(run, "snapshot")
        self._store.call("corrupt snapshot", "SETRANGE", key, 0, b'{"run_id": 7')

    # -- the run index (capabilities.run_index, standalone; see mayfly_redis._index) -------------

    def _indexed(self, operation: str) -> None:
        self.ensure_open(operation)
        if not self._capabilities.run_index:
            raise CompatibilityError(
                f"{operation}: the Redis Cluster store with prefix {self._target.prefix!r} at "
                f"{self._target.address} was written before run-index sharding and keeps no run index "
                "(a run's keys and its queue's live in different slots); run workers on a new prefix "
                "of the Cluster (a sharded store) or on a standalone Redis"
            )

    def _controlled(self, operation: str) -> None:
        self._indexed(operation)
        if not self._capabilities.queue_control:
            raise CompatibilityError(
                f"{operation}: the Redis Cluster store at {self._target.address} shards its run index "
                "over slots, so no script sees a queue's runs in progress in every shard and queue "
                "limits, priorities and dedup ids cannot be enforced; use a standalone Redis, "
                "PostgreSQL or LMDB for queue control"
            )

    def _fields(self, entry: IndexEntry) -> list[str]:
        """The entry as the scripts take it; a sharded store refuses a dedup id it could not enforce."""
        fields = _index.entry_fields(entry)
        if self._layout.sharded and fields[8]:
            raise CompatibilityError(
                f"index entry of run {entry.run_id}: the Redis Cluster store at {self._target.address} "
                "cannot enforce dedup ids across its shards (no queue_control); submit without one"
            )
        return fields

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None = None,
        held: Mapping[str, int] | None = None,
    ) -> list[RecoveryLeaseGuard]:
        """Lease up to ``limit`` claimable root runs to ``owner`` in claim order, in one script.

        The script selects and grants together (a new fencing token per run,
        the lease layout of :class:`~mayfly_redis.RedisLeaseStore`) and clears
        each run's wake, so no run goes to two claimants; the guards renew and
        release like those of ``RedisLeaseStore.acquire``. Each queue's
        settings limit the selection (``held``: the runs of each queue the
        claimant holds), and a first claim of a ``new`` run records its start
        at ``now_ms``, in the same script.
        """
        limit, names = check_claim(limit, queues)
        holding = check_held(held)
        _, owner, ttl = validate_acquire(_ANY_RUN, owner, ttl_ms)
        now = self._now(now_ms)
        self._indexed("claim")
        nonce = uuid.uuid4().hex
        pairs: list[Any] = [len(holding)]
        for name, count in holding.items():
            pairs += [name, count]
        tail = [ttl, _index.bound(now), nonce, now, *pairs, *(names or ())]
        layout = self._layout
        if not layout.sharded:
            wanted = {layout.prefix: limit}
        else:
            # Each shard looks first (granting nothing): the best `limit` runs of all shards in claim
            # order say how many to claim from each. Each shard's claim is atomic; a run another
            # claimant took in between is simply not granted here (the claim returns fewer).
            bases = layout.bases
            found = self._store.scripts(
                "claim runs",
                self._lua(_scripts.CLAIM),
                [(layout.route(base), [base, "", limit, *tail]) for base in bases],
            )
            looked = [
                (_text(member), base)
                for base, members in zip(bases, found, strict=True)
                for member in members
            ]
            wanted = {}
            for _, base in sorted(looked)[:limit]:
                wanted[base] = wanted.get(base, 0) + 1
        claimed: list[tuple[str, RecoveryLeaseGuard]] = []
        replies = self._store.scripts(
            "claim runs",
            self._lua(_scripts.CLAIM),
            [(layout.route(base), [base, owner, count, *tail]) for base, count in wanted.items()],
        )
        for reply in replies:
            for offset in range(0, len(reply), 5):
                # The fourth item (the run's record count) is not needed here.
                run, token, grant, _, member = (_text(item) for item in reply[offset : offset + 5])
                claimed.append((member, self._leases.adopt(run, owner, ttl, int(token), grant)))
        claimed.sort(key=lambda pair: pair[0])
        return [guard for _, guard in claimed]

    @staticmethod
    def _now(now_ms: object) -> int:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int) or not -(1 << 62) <= now_ms < 1 << 62:
            raise InvalidRecord(f"now_ms must be an int of wall-clock milliseconds, got {now_ms!r:.80}")
        return now_ms

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest ``ready_at_ms`` after ``now_ms`` of a waiting root run, or ``None``."""
        _, names = check_claim(1, queues)
        now = self._now(now_ms)
        self._indexed("next wake")
        layout = self._layout
        found = self._store.scripts(
            "next wake",
            self._lua(_scripts.NEXT_WAKE),
            [(layout.route(base), [base, _index.bound(now), *(names or ())]) for base in layout.bases],
        )
        times = [_index.decode_ready(ready) for ready in found if ready is not None]
        return min(times, default=None)

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        run = parse_run_id(run_id)
        self._indexed(f"index read of run {run}")
        flat = self._store.raw_call(f"index read of run {run}", "HGETALL", self._layout.key(run, "index"))
        if not flat:
            return None
        # A Cluster client answers HGETALL with a dict already.
        fields = flat if isinstance(flat, dict) else dict(zip(flat[0::2], flat[1::2], strict=True))
        return _index.decode_entry(run, fields)

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries in one script; a lower sequence never replaces a stored one; a stored wake stays."""
        given: object = entries
        if isinstance(given, str | bytes) or not isinstance(given, Sequence):
            raise InvalidRecord(f"index entries must be a sequence, got {type(given).__name__}")
        layout = self._layout
        # One script per shard (one in all on a standalone server), each atomic.
        shards: dict[str, list[str]] = {}
        for entry in entries:
            fields = self._fields(entry)
            base = layout.run_base(entry.run_id)
            shards.setdefault(base, [base, self._channel]).extend([entry.run_id, *fields])
        self._indexed("index put")
        for base, args in shards.items():
            self._store.script("index put", self._lua(_scripts.INDEX_PUT), layout.route(base), args)

    def index_wake(self, run_id: str) -> bool:
        """Ask for the run to be claimed although it waits; ``False`` if it has no entry or has ended."""
        run = parse_run_id(run_id)
        self._indexed(f"wake of run {run}")
        base = self._layout.run_base(run)
        woken = self._store.script(
            f"wake of run {run}",
            self._lua(_scripts.INDEX_WAKE),
            self._layout.route(base),
            [base, self._channel, run],
        )
        return bool(int(woken))

    def listen_wakeups(self) -> RedisWakeupListener:
        """Subscribe, on a connection of its own, to the wake-ups of this database and prefix."""
        self._indexed("listen for wake-ups")
        return RedisWakeupListener(self._store, self._channel)

    def notify_wakeups(self) -> None:
        """Tell every listening worker that some run became claimable now."""
        self._indexed("notify wake-ups")
        self._store.raw_call("notify wake-ups", "PUBLISH", self._channel, "1")

    # -- queue flow control (capabilities.queue_control, standalone; mayfly.queues.QueueControl) -----

    @property
    def _settings_key(self) -> str:
        return f"{self._target.prefix}:queue-settings"

    def _decode_settings(self, name: str, body: bytes) -> QueueSettings:
        try:
            settings = msgspec.json.decode(body, type=QueueSettings)
        except (msgspec.ValidationError, msgspec.DecodeError, InvalidRecord) as error:
            raise CorruptionError(
                f"settings of queue {name} under {self._settings_key} are unreadable ({error}); "
                f"set them again (queue_set) or remove them (queue_remove)"
            ) from None
        if settings.name != name:
            raise CorruptionError(
                f"settings stored for queue {name} under {self._settings_key} name queue "
                f"{settings.name}; set them again (queue_set) or remove them (queue_remove)"
            )
        return settings

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings, replacing any it had; claims obey them from now on.

        A queue that had no settings starts counting its runs in progress with
        the runs leased in it now (claims of a queue without settings do not
        track them, to stay as fast as before).
        """
        if not isinstance(settings, QueueSettings):
            raise InvalidRecord(f"queue settings must be a QueueSettings, got {type(settings).__name__}")
        self._controlled("queue settings")
        body = msgspec.json.encode(settings)
        self._store.script(
            f"set queue {settings.name}", _scripts.QUEUE_SET, [], [self._target.prefix, settings.name, body]
        )

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None`` if it has none."""
        _check_queue(name)
        self._controlled("queue settings")
        body = self._store.raw_call(f"read queue {name}", "HGET", self._settings_key, name)
        return None if body is None else self._decode_settings(name, body)

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        self._controlled("queue settings")
        flat = self._store.raw_call("list queues", "HGETALL", self._settings_key)
        stored = {_text(name): body for name, body in zip(flat[0::2], flat[1::2], strict=True)}
        return [self._decode_settings(name, stored[name]) for name in sorted(stored)]

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings (its runs are claimed without limits); ``False`` if it had none."""
        _check_queue(name)
        self._controlled("queue settings")
        return bool(int(self._store.raw_call(f"remove queue {name}", "HDEL", self._settings_key, name)))

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's runs in progress now and its starts within its rate window ending at ``now_ms``."""
        _check_queue(name)
        now = self._now(now_ms)
        self._controlled("queue usage")
        in_progress, starts = self._store.script(
            f"usage of queue {name}", _scripts.QUEUE_USAGE, [], [self._target.prefix, name, now]
        )
        return QueueUsage(in_progress=int(in_progress), recent_starts=int(starts))
