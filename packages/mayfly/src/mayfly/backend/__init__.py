"""The backend kit: what a storage backend builds on, so that it writes only its storage.

A backend subclasses :class:`JournalBase` and :class:`LeaseStoreBase` /
:class:`LeaseGuardBase` and implements their small storage hooks; the bases
implement the public methods of :class:`~mayfly.journal.WorkflowJournal`,
:class:`~mayfly.lease.RecoveryLeaseStore` and
:class:`~mayfly.lease.RecoveryLeaseGuard` once, with the validation, the
closed-state checks and the error wording the contract suite expects.
:func:`parse_backend_url` turns a URL into the location and a backend-declared
options struct, and :func:`backend_hooks` is the plugin in one line.
``docs/writing-a-backend.md`` walks through a backend built on the kit.

The Protocols stay the contract: a backend may still implement them from
scratch, and the contract suite certifies it the same way.
"""

from mayfly.backend._files import (
    PROC_LOCKS,
    VOLATILE_FILESYSTEMS,
    filesystem_type,
    held_flocks,
    parse_held_flocks,
)
from mayfly.backend._journal import MAX_LIST_LIMIT, JournalBase, decode_snapshot, encode_snapshot
from mayfly.backend._lease import LeaseGuardBase, LeaseStoreBase
from mayfly.backend._plugin import backend_hooks
from mayfly.backend._url import BackendURL, parse_backend_url
from mayfly.backend._wakeups import FifoWakeupListener, notify_fifo_wakeups

__all__ = [
    "MAX_LIST_LIMIT",
    "PROC_LOCKS",
    "VOLATILE_FILESYSTEMS",
    "BackendURL",
    "FifoWakeupListener",
    "JournalBase",
    "LeaseGuardBase",
    "LeaseStoreBase",
    "backend_hooks",
    "decode_snapshot",
    "encode_snapshot",
    "filesystem_type",
    "held_flocks",
    "notify_fifo_wakeups",
    "parse_backend_url",
    "parse_held_flocks",
]
