"""The Redis run index: how entries are laid out, ordered and checked (the scripts are in ``_scripts``).

Layout (``P`` the prefix, ``R`` a run id, ``Q`` a queue). The entry itself is
one hash beside the run's records, in the run's slot, so the append script
stores it in the same atomic step as the records:

* ``P:{R}:index`` hash: ``q`` queue, ``s`` status, ``r`` ready_at (``''``:
  none), ``n`` sequence, ``w`` wake, ``p`` parent, ``pr`` priority, ``d``
  dedup id and ``st`` started_ms (``''``: none), ``m`` the run's claim-order
  member, and where the run is filed (``loc``, ``wt``).

Claims look for runs in per-queue sets, hash-tagged ``{q:Q}``, whose members
all score 0 and sort by bytes in claim order (priority descending, then
ready_at with none last, then run id; see :func:`member`):

* ``P:{q:Q}:ready``: root runs with work now (``new``/``running``) or a wake
  request, that nobody held a lease on when they were filed;
* ``P:{q:Q}:leased``: those whose lease was live, scored by the lease's
  expiry (server milliseconds), so a claim puts a run whose owner died back
  in ``ready`` once its lease ran out, and a release puts it back at once;
* ``P:{q:Q}:waiting:<band>``: waiting root runs with a wake time, one set per
  priority band (``P:{q:Q}:bands`` lists them), so "due at ``now``" is one
  lexicographic range of members and the next wake time its first member
  past it;
* ``P:queues``: every queue that ever held an entry (a claim of every queue).

Queue flow control (``queue_control``, :mod:`mayfly.queues`):

* ``P:queue-settings`` hash: queue name -> its :class:`~mayfly.queues.QueueSettings`
  as msgspec JSON (the claim script decodes it with ``cjson``);
* ``P:{q:Q}:holding`` sorted set, kept for queues with settings: the runs
  a claim (or an ``acquire``) leased, scored by the grant's expiry; the
  queue's runs in progress are those members whose lease key is live and
  whose entry has not ended (claims of a limited queue drop the others, a
  release drops its run). Claims of a queue without settings skip it, to
  stay as fast as before; ``queue_set`` of a queue that had none fills it
  with the runs leased in it then;
* ``P:{q:Q}:starts`` sorted set: run id -> ``started_ms`` of each start (a
  first claim of a ``new`` entry), counted per rate window;
* ``P:{q:Q}:dedup`` hash: dedup id -> the run whose live entry holds it, set
  by the append that creates the run (which refuses a second live holder) and
  cleared when the holder's entry ends or is purged.

Children (entries with a parent) and ended runs are filed nowhere: they are
never claimed. A run waiting with no wake time is filed only once woken.

**On a Redis Cluster** the layout above would put a run's keys and its
queue's in different slots, and no script could store an entry and its queue
position together, nor grant a run's lease while selecting it from its queue.
A Cluster store therefore shards the index (:mod:`mayfly_redis._layout`): the
same structures exist once per shard, every key of a shard and of its runs
under the shard's hash tag, so every script above runs within one slot (the
scripts build the keys they touch from the shard's base, passed as the
prefix, with :func:`mayfly_redis._scripts.for_layout`). Queue flow control
would need a queue's runs in progress across every shard in one script, so a
Cluster store does not declare ``queue_control``. A Cluster store written
before sharding keeps no index at all; a worker refuses it by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mayfly.errors import CorruptionError, InvalidRecord
from mayfly.ids import DEDUP_ID, QUEUE_NAME, parse_run_id
from mayfly.runindex import IndexEntry, IndexStatus

__all__ = ["bound", "decode_entry", "entry_fields", "member"]

_OFFSET: Final = 1 << 63
_NONE: Final = "1" + "0" * 20


def _int64(value: object, what: str, run_id: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -_OFFSET <= value < _OFFSET:
        raise InvalidRecord(
            f"index entry of run {run_id!r:.80}: {what} must be a 64-bit int, got {value!r:.80}"
        )
    return value


def member(run_id: str, priority: int, ready_at_ms: int | None) -> str:
    """The run's member in its queue's sets: bytes order is claim order.

    Twenty digits of ``2**63 - 1 - priority`` (higher priorities first), then
    ``0`` and twenty digits of ``ready_at + 2**63`` (``1`` and zeros for none,
    which sorts last), ``|`` and the run id.
    """
    ready = _NONE if ready_at_ms is None else f"0{ready_at_ms + _OFFSET:020d}"
    return f"{_OFFSET - 1 - priority:020d}{ready}|{run_id}"


def bound(now_ms: int) -> str:
    """The ready_at part of a member at ``now_ms`` (the upper end of "due")."""
    return f"0{now_ms + _OFFSET:020d}"


def decode_ready(part: bytes | str) -> int:
    """The ready_at a member's twenty-digit part stands for."""
    text = part.decode() if isinstance(part, bytes) else part
    return int(text) - _OFFSET


def entry_fields(entry: object) -> list[str]:
    """The entry as the scripts take it.

    Queue, status, ready_at, sequence, wake, parent, priority, member, dedup
    id and started_ms, ``''`` standing for ``None``.

    Anything but a well-formed :class:`IndexEntry` raises ``InvalidRecord``.
    """
    if not isinstance(entry, IndexEntry):
        raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
    run = parse_run_id(entry.run_id)
    if not isinstance(entry.queue, str) or QUEUE_NAME.fullmatch(entry.queue) is None:
        raise InvalidRecord(
            f"index entry of run {run}: queue {entry.queue!r:.80} must match {QUEUE_NAME.pattern}"
        )
    if not isinstance(entry.status, IndexStatus):
        raise InvalidRecord(
            f"index entry of run {run}: status must be an IndexStatus, got {entry.status!r:.80}"
        )
    sequence = _int64(entry.sequence, "sequence", run)
    if sequence < 0:
        raise InvalidRecord(f"index entry of run {run}: sequence must be >= 0, got {sequence}")
    priority = _int64(entry.priority, "priority", run)
    ready = None if entry.ready_at_ms is None else _int64(entry.ready_at_ms, "ready_at_ms", run)
    if not isinstance(entry.wake, bool):
        raise InvalidRecord(f"index entry of run {run}: wake must be a bool, got {entry.wake!r:.80}")
    parent = "" if entry.parent is None else parse_run_id(entry.parent)
    dedup = entry.dedup_id
    if dedup is not None and (not isinstance(dedup, str) or DEDUP_ID.fullmatch(dedup) is None):
        raise InvalidRecord(f"index entry of run {run}: dedup id {dedup!r:.80} must match {DEDUP_ID.pattern}")
    started = None if entry.started_ms is None else _int64(entry.started_ms, "started_ms", run)
    return [
        entry.queue,
        entry.status.value,
        "" if ready is None else str(ready),
        str(sequence),
        "1" if entry.wake else "0",
        parent,
        str(priority),
        member(run, priority, ready),
        "" if dedup is None else dedup,
        "" if started is None else str(started),
    ]


def decode_entry(run_id: str, fields: Mapping[bytes, bytes]) -> IndexEntry:
    """The entry stored as ``fields`` (an ``HGETALL`` reply); ``CorruptionError`` if it is unreadable."""
    try:
        text = {key.decode(): value.decode() for key, value in fields.items()}
        ready = text["r"]
        parent = text["p"]
        dedup = text.get("d", "")  # entries stored before queue control have neither
        started = text.get("st", "")
        return IndexEntry(
            run_id=run_id,
            queue=text["q"],
            status=IndexStatus(text["s"]),
            ready_at_ms=None if ready == "" else int(ready),
            sequence=int(text["n"]),
            wake=text["w"] == "1",
            parent=None if parent == "" else parent,
            priority=int(text["pr"]),
            dedup_id=None if dedup == "" else dedup,
            started_ms=None if started == "" else int(started),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as error:
        raise CorruptionError(
            f"run index entry of run {run_id} is unreadable ({error!r}); put the run's entry again "
            "(index_put of the entry its replayed state has)"
        ) from None
