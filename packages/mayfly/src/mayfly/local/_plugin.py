"""The built-in ``file://`` backend, published through the ``mayfly`` entry-point group."""

from __future__ import annotations

from mayfly.backend import backend_hooks
from mayfly.local._journal import LocalWorkflowJournal
from mayfly.local._lease import LocalLeaseStore
from mayfly.local._store import parse_url

MAYFLY_PLUGIN_API = 1


def _describe(url: str) -> str:
    """One line for ``mayfly backends``: what the local journal at ``url`` guarantees."""
    target = parse_url(url)
    return f"local file journal at {target.root}, durability {target.durability}, flock leases"


def _exists(url: str) -> bool:
    """Whether a local journal is at ``url``: its directory holds the store's ``runs`` directory."""
    return (parse_url(url).root / "runs").is_dir()


mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
    ("file",),
    "mayfly-runtime",
    LocalWorkflowJournal,
    LocalLeaseStore,
    describe=_describe,
    exists=_exists,
    summary="local append-only file journal (MWJ1), durability fsync|flush|write, flock leases",
)
