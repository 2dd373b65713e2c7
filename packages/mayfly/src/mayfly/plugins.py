"""The plugin manager: lazy entry-point loading, typed hook calls and URL scheme resolution.

A :class:`PluginManager` is the plugin context a runtime and every CLI command
are built with (``WorkflowRuntime(..., plugins=...)``, ``mayfly.cli.main(...,
plugins=...)``); by default it is the process's entry-point manager,
:func:`plugin_manager`. Nothing installs it process-wide: this module sits
below the runtime in the layer order (ARCHITECTURE section 4) and imports
only the storage contracts, the hook specifications, the reducer's pure
validation and the model.

Plugins are published in the ``mayfly`` entry-point group and loaded on first
use, never at ``import mayfly``. Each must declare ``MAYFLY_PLUGIN_API``
(see :mod:`mayfly.hookspecs`); ``check_pending()`` then makes a misspelled
hook fail loudly. Two environment variables select plugins by entry-point
name or distribution name, comma-separated:

* ``MAYFLY_PLUGINS``: load only these (an allow list);
* ``MAYFLY_DISABLE_PLUGINS``: never load these (a block list, applied last).

Core code calls hooks only through the typed methods of
:class:`PluginManager`, never through ``pm.hook`` directly.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Final, final

import pluggy

from mayfly import hookspecs
from mayfly.hookspecs import PLUGIN_API, PROJECT_NAME, BackendDescriptor
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import (
    BackendNotInstalled,
    CompatibilityError,
    InvalidBackendURL,
    PluginError,
    SpecValidationError,
    ValidationIssue,
)
from mayfly.model.spec import WorkflowSpec
from mayfly.reducer import Upcaster, validate

Upcasters = Mapping[tuple[str, int], Upcaster]
"""Event upcasters keyed by ``(event_type, from_version)``, as the read paths take them."""

__all__ = [
    "KNOWN_BACKEND_DISTRIBUTIONS",
    "BackendInfo",
    "PluginManager",
    "Upcasters",
    "list_backends",
    "open_journal",
    "open_leases",
    "plugin_manager",
    "url_scheme",
]

KNOWN_BACKEND_DISTRIBUTIONS: Final[Mapping[str, str]] = {
    "file": "mayfly-runtime",
    "postgresql": "mayfly-runtime[postgres]",
    "postgres": "mayfly-runtime[postgres]",
    "redis": "mayfly-runtime[redis]",
    "rediss": "mayfly-runtime[redis]",
    "lmdb": "mayfly-runtime[lmdb]",
}
"""What to install for the schemes of first-party backends, for the not-installed error."""

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_JOURNAL: Final = "journal"
_LEASE: Final = "lease"


def url_scheme(url: str) -> str:
    """Return the lowercase scheme of a backend URL; a bare path means ``file``."""
    if not isinstance(url, str) or not url:
        raise InvalidBackendURL(f"backend URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        return "file"
    scheme = url.split("://", 1)[0].lower()
    if _SCHEME.fullmatch(scheme) is None:
        raise InvalidBackendURL(f"backend URL {url!r} has a malformed scheme {scheme!r}")
    return scheme


@final
@dataclass(frozen=True, slots=True)
class BackendInfo:
    """One installed backend scheme, as ``mayfly backends`` lists it."""

    kind: str
    scheme: str
    distribution: str
    plugin: str
    description: str


@dataclass(frozen=True, slots=True)
class _Registered:
    descriptor: BackendDescriptor
    plugin: str


def _names(value: str | None) -> frozenset[str]:
    return frozenset(part.strip() for part in (value or "").split(",") if part.strip())


def _declared_api(plugin: object) -> tuple[int, ...]:
    declared = getattr(plugin, "MAYFLY_PLUGIN_API", None)
    if isinstance(declared, int) and not isinstance(declared, bool):
        return (declared,)
    if isinstance(declared, tuple) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in declared
    ):
        return declared
    return ()


def _is_upcaster_key(key: object) -> bool:
    return (
        isinstance(key, tuple)
        and len(key) == 2
        and isinstance(key[0], str)
        and isinstance(key[1], int)
        and not isinstance(key[1], bool)
    )


def _items(plugin: str, result: object, hook: str) -> tuple[object, ...]:
    if result is None:
        return ()
    if not isinstance(result, list | tuple):
        raise PluginError(f"plugin {plugin!r} returned {type(result).__name__} from {hook}; return a list")
    return tuple(result)


@final
class PluginManager:
    """Mayfly's pluggy manager: loads plugins lazily and exposes every hook as a typed method."""

    def __init__(
        self,
        *,
        load_entry_points: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self._allow = _names(env.get("MAYFLY_PLUGINS"))
        self._block = _names(env.get("MAYFLY_DISABLE_PLUGINS"))
        self._load_entry_points = load_entry_points
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._distributions: dict[str, str] = {}
        self._broken: dict[str, str] = {}
        self._loaded = False
        self._lock = threading.RLock()
        self._tables: dict[str, dict[str, _Registered]] = {}
        self._upcasters: Upcasters | None = None

    def register(self, plugin: object, *, name: str, distribution: str) -> None:
        """Register ``plugin`` under ``name`` after checking its declared plugin API."""
        api = _declared_api(plugin)
        if not api:
            raise CompatibilityError(
                f"plugin {name!r} from {distribution} declares no MAYFLY_PLUGIN_API; "
                f"add MAYFLY_PLUGIN_API = {PLUGIN_API} to it"
            )
        if PLUGIN_API not in api:
            raise CompatibilityError(
                f"plugin {name!r} from {distribution} speaks plugin API {api}, this Mayfly "
                f"speaks {PLUGIN_API}; install a {distribution} release made for it"
            )
        with self._lock:
            if self._pm.is_registered(plugin):
                return
            try:
                self._pm.register(plugin, name=name)
                self._pm.check_pending()
            except (ValueError, pluggy.PluginValidationError) as error:
                if self._pm.is_registered(plugin):
                    self._pm.unregister(plugin)
                raise PluginError(f"plugin {name!r} from {distribution} is invalid: {error}") from None
            self._distributions[name] = distribution
            self._tables.clear()
            self._upcasters = None

    def _selected(self, entry_point: EntryPoint) -> bool:
        distribution = entry_point.dist.name if entry_point.dist is not None else ""
        keys = {entry_point.name, distribution}
        if self._allow and not keys & self._allow:
            return False
        return not keys & self._block

    def load(self) -> None:
        """Load the ``mayfly`` entry-point group once (allow and block lists applied)."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            if not self._load_entry_points:
                return
            for entry_point in sorted(entry_points(group=PROJECT_NAME), key=lambda ep: ep.name):
                if not self._selected(entry_point):
                    continue
                distribution = entry_point.dist.name if entry_point.dist else "an unknown distribution"
                # A plugin that cannot load is set aside, not fatal: one broken backend must
                # not take every other backend down. It is named whenever a lookup fails.
                try:
                    plugin = entry_point.load()
                except Exception as error:
                    self._broken[entry_point.name] = (
                        f"plugin {entry_point.name!r} from {distribution} failed to import "
                        f"({type(error).__name__}: {error}); reinstall it or disable it with "
                        f"MAYFLY_DISABLE_PLUGINS={entry_point.name}"
                    )
                    continue
                try:
                    self.register(plugin, name=entry_point.name, distribution=distribution)
                except (CompatibilityError, PluginError) as error:
                    self._broken[entry_point.name] = str(error)

    def broken_plugins(self) -> dict[str, str]:
        """Return the plugins that failed to load, by entry-point name, with the reason."""
        self.load()
        with self._lock:
            return dict(self._broken)

    def plugin_names(self) -> list[str]:
        """Return the names of the registered plugins, sorted."""
        self.load()
        with self._lock:
            return sorted(self._distributions)

    def _table(self, kind: str) -> dict[str, _Registered]:
        self.load()
        with self._lock:
            table = self._tables.get(kind)
            if table is not None:
                return table
            hook = (
                self._pm.hook.mayfly_journal_backends
                if kind == _JOURNAL
                else self._pm.hook.mayfly_lease_backends
            )
            table = {}
            for plugin, result in self._results(hook):
                for descriptor in _items(plugin, result, hook.name):
                    if not isinstance(descriptor, BackendDescriptor):
                        raise PluginError(
                            f"plugin {plugin!r} returned {type(descriptor).__name__} from its "
                            f"{kind} backend hook; return BackendDescriptor values"
                        )
                    for scheme in descriptor.schemes:
                        clash = table.get(scheme)
                        if clash is not None:
                            raise PluginError(
                                f"{kind} scheme {scheme}:// is provided by both "
                                f"{clash.descriptor.distribution} (plugin {clash.plugin!r}) and "
                                f"{descriptor.distribution} (plugin {plugin!r}); uninstall one or "
                                "disable it with MAYFLY_DISABLE_PLUGINS"
                            )
                        table[scheme] = _Registered(descriptor, plugin)
            self._tables[kind] = table
            return table

    def _results(self, hook: pluggy.HookCaller, **kwargs: object) -> Iterable[tuple[str, object]]:
        """Call ``hook`` on each plugin separately, so every result is attributed to its plugin."""
        for implementation in hook.get_hookimpls():
            name = self._pm.get_name(implementation.plugin) or "?"
            caller = self._pm.subset_hook_caller(
                hook.name,
                remove_plugins=[
                    other.plugin
                    for other in hook.get_hookimpls()
                    if other.plugin is not implementation.plugin
                ],
            )
            try:
                results = caller(**kwargs)
            except Exception as error:
                # A hook that crashes (a validator, say) must not pass for one that found nothing.
                raise PluginError(
                    f"plugin {name!r} raised {type(error).__name__} in {hook.name}: {error}"
                ) from error
            for result in results:
                yield name, result

    def _resolve(self, kind: str, url: str) -> BackendDescriptor:
        scheme = url_scheme(url)
        registered = self._table(kind).get(scheme)
        if registered is None:
            with self._lock:
                broken = list(self._broken.values())
            if broken:
                raise PluginError(
                    f"no loaded plugin serves {scheme}://, and some plugins failed to load: "
                    + "; ".join(broken)
                )
            raise BackendNotInstalled(scheme, KNOWN_BACKEND_DISTRIBUTIONS.get(scheme))
        return registered.descriptor

    def open_journal(self, url: str) -> WorkflowJournal:
        """Open the journal at ``url`` through the backend serving its scheme."""
        descriptor = self._resolve(_JOURNAL, url)
        journal = descriptor.open(url)
        if not isinstance(journal, WorkflowJournal):
            raise PluginError(
                f"{descriptor.distribution} opened {type(journal).__name__} for {url_scheme(url)}://,"
                " which does not implement WorkflowJournal"
            )
        return journal

    def journal_exists(self, url: str) -> bool | None:
        """Whether a journal is already at ``url`` (``None``: its backend cannot tell); creates nothing."""
        exists = self._resolve(_JOURNAL, url).exists
        return None if exists is None else bool(exists(url))

    def open_leases(self, url: str) -> RecoveryLeaseStore:
        """Open the recovery-lease store at ``url`` through the backend serving its scheme."""
        descriptor = self._resolve(_LEASE, url)
        store = descriptor.open(url)
        if not isinstance(store, RecoveryLeaseStore):
            raise PluginError(
                f"{descriptor.distribution} opened {type(store).__name__} for {url_scheme(url)}://,"
                " which does not implement RecoveryLeaseStore"
            )
        return store

    def list_backends(self, url: str | None = None) -> list[BackendInfo]:
        """Return every installed journal and lease scheme, sorted, described for ``url`` if given."""
        rows: list[BackendInfo] = []
        for kind in (_JOURNAL, _LEASE):
            for scheme, registered in sorted(self._table(kind).items()):
                description = ""
                describe = registered.descriptor.describe
                if describe is not None:
                    try:
                        target = url if url and url_scheme(url) == scheme else f"{scheme}://"
                        description = describe(target)
                    except Exception as error:
                        description = f"(describe failed: {type(error).__name__}: {error})"
                rows.append(
                    BackendInfo(
                        kind=kind,
                        scheme=scheme,
                        distribution=registered.descriptor.distribution,
                        plugin=registered.plugin,
                        description=description,
                    )
                )
        return rows

    def register_handlers(self, registry: object) -> None:
        """Let every plugin register its handlers on ``registry``."""
        self.load()
        self._pm.hook.mayfly_register_handlers(registry=registry)

    def validate_spec(self, spec: object) -> list[ValidationIssue]:
        """Collect the extra validation issues every plugin reports for ``spec`` (plugins only)."""
        self.load()
        issues: list[ValidationIssue] = []
        for plugin, result in self._results(self._pm.hook.mayfly_validate_spec, spec=spec):
            for issue in _items(plugin, result, "mayfly_validate_spec"):
                if not isinstance(issue, ValidationIssue):
                    raise PluginError(
                        f"plugin {plugin!r} returned {type(issue).__name__} from "
                        "mayfly_validate_spec; return ValidationIssue values"
                    )
                issues.append(issue)
        return issues

    def validate(self, spec: WorkflowSpec) -> list[ValidationIssue]:
        """Every issue of ``spec``: the core's own, then each plugin validator's (empty if it is valid).

        This is the validation ``WorkflowRuntime.execute`` and ``mayfly run``
        apply; a plugin can only add issues, never remove or rewrite one.
        """
        return [*validate(spec), *self.validate_spec(spec)]

    def ensure_valid(self, spec: WorkflowSpec) -> None:
        """Raise :class:`~mayfly.model.errors.SpecValidationError` with every issue :meth:`validate` finds."""
        issues = self.validate(spec)
        if issues:
            raise SpecValidationError(issues)

    def event_upcasters(self) -> Upcasters:
        """Every plugin's upcasters merged (read-only); a key registered twice is an error naming both.

        Merged once and kept until another plugin is registered. A key that is
        not ``(event_type, from_version)`` or an upcaster that is not callable
        is refused naming its plugin.
        """
        self.load()
        with self._lock:
            if self._upcasters is not None:
                return self._upcasters
            merged: dict[tuple[str, int], Upcaster] = {}
            owners: dict[tuple[str, int], str] = {}
            for plugin, result in self._results(self._pm.hook.mayfly_event_upcasters):
                if not isinstance(result, Mapping):
                    raise PluginError(
                        f"plugin {plugin!r} returned {type(result).__name__} from "
                        "mayfly_event_upcasters; return a mapping"
                    )
                for key, upcaster in result.items():
                    if not _is_upcaster_key(key) or not callable(upcaster):
                        raise PluginError(
                            f"plugin {plugin!r} returned {key!r}: {type(upcaster).__name__} from "
                            "mayfly_event_upcasters; map (event_type, from_version) to a callable"
                        )
                    if key in merged:
                        raise PluginError(
                            f"upcaster for {key[0]} version {key[1]} is registered by both "
                            f"plugin {owners[key]!r} and plugin {plugin!r}; uninstall one or "
                            "disable it with MAYFLY_DISABLE_PLUGINS"
                        )
                    merged[key] = upcaster
                    owners[key] = plugin
            self._upcasters = MappingProxyType(merged)
            return self._upcasters

    def publish_metrics(self, snapshot: object) -> None:
        """Hand one complete, immutable metrics snapshot to every ``mayfly_publish_metrics`` plugin."""
        self.load()
        self._pm.hook.mayfly_publish_metrics(snapshot=snapshot)


_default: PluginManager | None = None
_default_lock = threading.Lock()


def plugin_manager() -> PluginManager:
    """Return the process-wide plugin manager, created (but not loaded) on first call."""
    global _default  # noqa: PLW0603  # one lazily created manager per process
    with _default_lock:
        if _default is None:
            _default = PluginManager()
        return _default


def open_journal(url: str) -> WorkflowJournal:
    """Open a journal by URL (``file://DIR``, a bare path, or a plugin's scheme)."""
    return plugin_manager().open_journal(url)


def open_leases(url: str) -> RecoveryLeaseStore:
    """Open a recovery-lease store by URL (usually the journal's URL)."""
    return plugin_manager().open_leases(url)


def list_backends(url: str | None = None) -> list[BackendInfo]:
    """Return every installed backend scheme, for ``mayfly backends``."""
    return plugin_manager().list_backends(url)
