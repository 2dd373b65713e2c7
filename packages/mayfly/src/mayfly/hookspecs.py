"""Pluggy hook specifications of the ``mayfly`` project (ARCHITECTURE §5).

A plugin is a module (or object) exposed in the ``mayfly`` entry-point group
of its distribution, for example::

    [project.entry-points.mayfly]
    sqlite = "mayfly_example_sqlite"

It must declare the plugin API it was written for, ``MAYFLY_PLUGIN_API = 1``
(an int, or a tuple of ints if it supports several), and implement any of the
hooks below with ``@mayfly.hookspecs.hookimpl``. The plugin manager refuses a
plugin that declares no API or an API this core does not speak, naming the
distribution, instead of failing later in a confusing way.

A storage backend usually takes both backend hooks from
``mayfly.backend.backend_hooks`` instead of writing them.

This module sits beside the journal and lease contracts and may not import
them, so hook signatures use ``object``; the typed wrappers in
:mod:`mayfly.plugins` check what plugins return.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

import pluggy

from mayfly.model.errors import ValidationIssue

__all__ = [
    "PLUGIN_API",
    "PROJECT_NAME",
    "BackendDescriptor",
    "hookimpl",
    "hookspec",
    "mayfly_event_upcasters",
    "mayfly_journal_backends",
    "mayfly_lease_backends",
    "mayfly_publish_metrics",
    "mayfly_register_handlers",
    "mayfly_validate_spec",
]

PROJECT_NAME: Final = "mayfly"
"""The pluggy project name and the entry-point group plugins are published in."""

PLUGIN_API: Final = 1
"""The plugin API this core speaks; plugins declare it as ``MAYFLY_PLUGIN_API``."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@final
@dataclass(frozen=True, slots=True)
class BackendDescriptor:
    """One storage backend a plugin offers: URL schemes, its distribution and how to open it.

    ``open(url)`` returns a journal (for ``mayfly_journal_backends``) or a
    lease store (for ``mayfly_lease_backends``). ``describe(url)``, when given,
    returns one line for ``mayfly backends`` (e.g. the durability it meets).
    ``distribution`` is the installable name, used in error messages.
    ``exists(url)``, when given, says without creating anything whether a
    store is already at ``url``, so read-only commands can refuse a mistyped
    URL instead of opening (and creating) an empty store there.
    """

    schemes: tuple[str, ...]
    distribution: str
    open: Callable[[str], object]
    describe: Callable[[str], str] | None = None
    exists: Callable[[str], bool] | None = None


@hookspec(firstresult=False)
def mayfly_journal_backends() -> Sequence[BackendDescriptor]:  # type: ignore[empty-body]
    """Return the journal backends this plugin provides, one descriptor per backend.

    Called once when the plugin manager builds its scheme table; every
    plugin's list is collected (``firstresult=False``). A scheme offered by two
    distributions is an error naming both, never last-wins. ``open(url)``
    must return an object implementing ``mayfly.journal.WorkflowJournal``.
    """


@hookspec(firstresult=False)
def mayfly_lease_backends() -> Sequence[BackendDescriptor]:  # type: ignore[empty-body]
    """Return the recovery-lease backends this plugin provides, one descriptor per backend.

    Same shape and rules as :func:`mayfly_journal_backends`; ``open(url)`` must
    return an object implementing ``mayfly.lease.RecoveryLeaseStore``. A backend
    whose journal checks fencing tokens must serve leases on the same URL.
    """


@hookspec(firstresult=False)
def mayfly_register_handlers(registry: object) -> None:
    """Register this plugin's workflow handlers on ``registry`` (a ``HandlerRegistry``).

    Every plugin is called (``firstresult=False``). Handlers are registered by
    ``(name, version)``; registering a pair that is already taken raises in
    the registry, so two plugins can never silently replace each other.
    """


@hookspec(firstresult=False)
def mayfly_validate_spec(spec: object) -> Sequence[ValidationIssue]:  # type: ignore[empty-body]
    """Return extra validation issues for ``spec`` (a ``WorkflowSpec``); empty if it is fine.

    Every plugin is called and all issues are collected (``firstresult=False``).
    A hook can only reject a specification, never rewrite it: the spec must
    be treated as read-only and the returned issues are reported together
    with the core's own.
    """


@hookspec(firstresult=False)
def mayfly_event_upcasters() -> Mapping[tuple[str, int], Callable[[object], object]]:  # type: ignore[empty-body]
    """Return upcasters keyed by ``(event_type, from_version)``.

    Each upcaster turns an event body of ``from_version`` into the body of
    the next version. All plugins' mappings are merged (``firstresult=False``);
    two plugins registering the same key is an error. The reducer stays pure
    and total, and an event version with no upcaster still fails closed.
    """


@hookspec(firstresult=False)
def mayfly_publish_metrics(snapshot: object) -> None:
    """Receive one complete metrics projection (a ``mayfly.telemetry.MetricsSnapshot``) to export.

    Every plugin is called (``firstresult=False``) with the same immutable
    snapshot, so an exporter sees a whole projection or none, never a partial
    update. Its labels are closed enums (run state, node state, failure class,
    outcome class, recovery mode, latency bucket); run, node, attempt,
    workflow and handler ids never appear. Return values are ignored, and
    metrics never feed back into a run: losing them changes no replay.
    """
