"""The embedded default backend: a ``file://DIR`` journal and recovery leases on one directory.

``LocalWorkflowJournal`` stores append-only MWJ2 frames per run and MWS1
snapshot frames; ``LocalLeaseStore`` grants recovery leases through OS file
locks and a persistent fencing counter. Both live in core and need nothing
beyond the standard library and msgspec. Open them by URL with
``mayfly.plugins.open_journal("file:///var/lib/app/mayfly")`` or directly.
"""

from mayfly.local._journal import LocalWorkflowJournal
from mayfly.local._lease import LocalLeaseGuard, LocalLeaseStore

__all__ = ["LocalLeaseGuard", "LocalLeaseStore", "LocalWorkflowJournal"]
