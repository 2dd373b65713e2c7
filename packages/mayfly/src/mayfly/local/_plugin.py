"""The built-in ``file://`` backend, published through the ``mayfly`` entry-point group."""

from __future__ import annotations

from collections.abc import Sequence

from mayfly.hookspecs import BackendDescriptor, hookimpl
from mayfly.local._journal import LocalWorkflowJournal
from mayfly.local._lease import LocalLeaseStore
from mayfly.local._store import parse_url

MAYFLY_PLUGIN_API = 1

_SCHEMES = ("file",)
_DISTRIBUTION = "mayfly"


def _describe(url: str) -> str:
    """One line for ``mayfly backends``: what the local journal at ``url`` guarantees."""
    if url in ("file://", ""):
        return "local append-only file journal (MWJ1), durability fsync|flush|write, flock leases"
    target = parse_url(url)
    return f"local file journal at {target.root}, durability {target.durability}, flock leases"


@hookimpl
def mayfly_journal_backends() -> Sequence[BackendDescriptor]:
    """Offer the local file journal for ``file://`` URLs and bare paths."""
    return [BackendDescriptor(_SCHEMES, _DISTRIBUTION, LocalWorkflowJournal, _describe)]


@hookimpl
def mayfly_lease_backends() -> Sequence[BackendDescriptor]:
    """Offer local flock recovery leases for ``file://`` URLs and bare paths."""
    return [BackendDescriptor(_SCHEMES, _DISTRIBUTION, LocalLeaseStore, _describe)]
