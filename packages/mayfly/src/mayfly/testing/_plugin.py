"""The built-in ``memory://`` backend for tests, published through the ``mayfly`` entry-point group."""

from __future__ import annotations

from mayfly.testing._memory import mayfly_journal_backends, mayfly_lease_backends

MAYFLY_PLUGIN_API = 1

__all__ = ["MAYFLY_PLUGIN_API", "mayfly_journal_backends", "mayfly_lease_backends"]
