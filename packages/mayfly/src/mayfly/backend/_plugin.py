"""The one-line plugin of a storage backend: both hook implementations from one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mayfly.hookspecs import BackendDescriptor, hookimpl

__all__ = ["backend_hooks"]

_Hook = Callable[[], Sequence[BackendDescriptor]]


def backend_hooks(
    schemes: Sequence[str],
    distribution: str,
    journal: Callable[[str], object],
    leases: Callable[[str], object] | None = None,
    *,
    describe: Callable[[str], str] | None = None,
    summary: str | None = None,
    exists: Callable[[str], bool] | None = None,
) -> tuple[_Hook, _Hook]:
    """Return ``mayfly_journal_backends`` and ``mayfly_lease_backends`` hooks offering one backend.

    Assign them at module level in the module the entry point names, beside
    the API it was written for::

        MAYFLY_PLUGIN_API = 1
        mayfly_journal_backends, mayfly_lease_backends = backend_hooks(
            ("sqlite",), "mayfly-example-sqlite", SqliteJournal, SqliteLeaseStore, summary="SQLite ..."
        )

    ``journal(url)`` and ``leases(url)`` open the backend (usually the
    classes). ``summary`` is the line ``mayfly backends`` prints when no URL
    of the scheme is given; ``describe(url)`` the line for a given URL. A
    backend without leases passes ``leases=None`` and offers none.
    ``exists(url)`` says, creating nothing, whether a store is at ``url``.
    """
    names = tuple(schemes)

    def line(url: str) -> str:
        if summary is not None and (not url or url.split("://", 1)[-1] in ("", "/")):
            return summary
        if describe is None:
            return summary or ""
        return describe(url)

    described = line if describe is not None or summary is not None else None
    journals = [BackendDescriptor(names, distribution, journal, described, exists)]
    lease_stores = [] if leases is None else [BackendDescriptor(names, distribution, leases, described)]

    @hookimpl
    def mayfly_journal_backends() -> Sequence[BackendDescriptor]:
        """Offer the journal for the backend's schemes."""
        return journals

    @hookimpl
    def mayfly_lease_backends() -> Sequence[BackendDescriptor]:
        """Offer the recovery-lease store for the backend's schemes."""
        return lease_stores

    return mayfly_journal_backends, mayfly_lease_backends
