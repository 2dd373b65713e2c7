"""Tests of the plugin manager: entry points, API declarations, scheme resolution and hooks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from mayfly.hookspecs import BackendDescriptor, hookimpl
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.errors import (
    BackendNotInstalled,
    CompatibilityError,
    InvalidBackendURL,
    PluginError,
    ValidationIssue,
)
from mayfly.plugins import PluginManager, list_backends, open_journal, open_leases, url_scheme


class StorePlugin:
    """A test plugin offering one journal scheme from a named distribution."""

    MAYFLY_PLUGIN_API = 1

    def __init__(self, scheme: str, distribution: str, opener: Callable[[str], object]) -> None:
        self.scheme = scheme
        self.distribution = distribution
        self.opener = opener

    @hookimpl
    def mayfly_journal_backends(self) -> Sequence[BackendDescriptor]:
        return [BackendDescriptor((self.scheme,), self.distribution, self.opener)]


class PolicyPlugin:
    """A test plugin using the handler, specification and reducer hooks."""

    MAYFLY_PLUGIN_API = (1, 2)

    def __init__(self, tag: str) -> None:
        self.tag = tag

    @hookimpl
    def mayfly_register_handlers(self, registry: list[str]) -> None:
        registry.append(self.tag)

    @hookimpl
    def mayfly_validate_spec(self, spec: object) -> Sequence[ValidationIssue]:
        return [ValidationIssue("nodes", f"{self.tag} rejects {spec}")]

    @hookimpl
    def mayfly_event_upcasters(self) -> Mapping[tuple[str, int], Callable[[object], object]]:
        return {("NodeStarted", 1): lambda body: body}


def manager() -> PluginManager:
    return PluginManager(load_entry_points=False, environ={})


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("file:///x", "file"),
        ("/var/lib/mayfly", "file"),
        ("./relative", "file"),
        ("PostgreSQL://h/db", "postgresql"),
        ("lmdb:///x", "lmdb"),
    ],
)
def test_url_scheme(url: str, scheme: str) -> None:
    """Schemes are lowercased and a bare path means file://."""
    assert url_scheme(url) == scheme


def test_malformed_scheme_is_refused() -> None:
    """A URL whose scheme breaks the URL grammar is an InvalidBackendURL."""
    with pytest.raises(InvalidBackendURL):
        url_scheme("9x://y")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:pw@db/x", 'postgresql:// needs: pip install "mayfly-runtime[postgres]"'),
        ("postgres://db/x", 'postgres:// needs: pip install "mayfly-runtime[postgres]"'),
        ("redis://localhost", 'redis:// needs: pip install "mayfly-runtime[redis]"'),
        ("rediss://localhost", 'rediss:// needs: pip install "mayfly-runtime[redis]"'),
        ("lmdb:///x", 'lmdb:// needs: pip install "mayfly-runtime[lmdb]"'),
        ("nosuch://x", "no installed Mayfly backend serves nosuch://"),
    ],
)
def test_unknown_scheme_names_the_distribution(url: str, message: str) -> None:
    """An uninstalled scheme raises BackendNotInstalled saying what to pip install."""
    with pytest.raises(BackendNotInstalled) as caught:
        manager().open_journal(url)
    assert message in str(caught.value)


def test_builtin_local_backend_is_found_through_its_entry_point(tmp_path: Path) -> None:
    """file:// URLs and bare paths open the local journal and lease store via the entry point."""
    journal = open_journal(f"file://{tmp_path}")
    assert isinstance(journal, LocalWorkflowJournal)
    assert isinstance(open_journal(str(tmp_path)), LocalWorkflowJournal)
    assert isinstance(open_leases(str(tmp_path)), LocalLeaseStore)
    rows = {(row.kind, row.scheme, row.distribution) for row in list_backends()}
    assert {("journal", "file", "mayfly-runtime"), ("lease", "file", "mayfly-runtime")} <= rows


def test_duplicate_scheme_names_both_distributions() -> None:
    """Two distributions offering one scheme is an error naming both, never last-wins."""
    plugins = manager()
    plugins.register(StorePlugin("x", "dist-one", str), name="one", distribution="dist-one")
    plugins.register(StorePlugin("x", "dist-two", str), name="two", distribution="dist-two")
    with pytest.raises(PluginError, match=r"dist-one.*dist-two"):
        plugins.open_journal("x://anything")


def test_plugin_without_api_declaration_is_refused() -> None:
    """A plugin that declares no MAYFLY_PLUGIN_API is refused at load, naming its distribution."""

    class Silent:
        @hookimpl
        def mayfly_journal_backends(self) -> Sequence[BackendDescriptor]:
            return []

    with pytest.raises(CompatibilityError, match="silent-dist declares no MAYFLY_PLUGIN_API"):
        manager().register(Silent(), name="silent", distribution="silent-dist")


def test_plugin_for_another_api_is_refused() -> None:
    """A plugin written for a different plugin API is refused with the versions involved."""

    class Future:
        MAYFLY_PLUGIN_API = 7

    with pytest.raises(CompatibilityError, match=r"speaks plugin API \(7,\)"):
        manager().register(Future(), name="future", distribution="future-dist")


def test_misspelled_hook_fails_loudly() -> None:
    """check_pending turns a hook implementation with a misspelled name into a PluginError."""

    class Typo:
        MAYFLY_PLUGIN_API = 1

        @hookimpl
        def mayfly_journal_backend(self) -> Sequence[BackendDescriptor]:
            return []

    plugins = manager()
    with pytest.raises(PluginError, match="typo-dist"):
        plugins.register(Typo(), name="typo", distribution="typo-dist")
    assert plugins.plugin_names() == []


def test_backend_returning_the_wrong_type_is_refused() -> None:
    """An opener that returns something that is not a journal is reported, not used."""
    plugins = manager()
    plugins.register(StorePlugin("odd", "odd-dist", lambda url: 42), name="odd", distribution="odd-dist")
    with pytest.raises(PluginError, match="odd-dist opened int"):
        plugins.open_journal("odd://x")


def test_block_list_disables_the_builtin_backend(tmp_path: Path) -> None:
    """MAYFLY_DISABLE_PLUGINS wins over MAYFLY_PLUGINS: a blocked plugin never loads."""
    plugins = PluginManager(environ={"MAYFLY_PLUGINS": "local", "MAYFLY_DISABLE_PLUGINS": "local"})
    with pytest.raises(BackendNotInstalled, match="file:// needs"):
        plugins.open_journal(str(tmp_path))


def test_allow_list_loads_only_named_plugins(tmp_path: Path) -> None:
    """MAYFLY_PLUGINS loads only the plugins it names (by entry point or distribution)."""
    assert PluginManager(environ={"MAYFLY_PLUGINS": "other"}).plugin_names() == []
    assert "local" in PluginManager(environ={"MAYFLY_PLUGINS": "mayfly-runtime"}).plugin_names()


def test_typed_hook_wrappers_collect_every_plugin() -> None:
    """Handler, spec and upcaster hooks reach every plugin; duplicate upcasters are refused."""
    plugins = manager()
    plugins.register(PolicyPlugin("a"), name="a", distribution="dist-a")
    registry: list[str] = []
    plugins.register_handlers(registry)
    assert registry == ["a"]
    assert plugins.validate_spec("spec-1") == [ValidationIssue("nodes", "a rejects spec-1")]
    assert list(plugins.event_upcasters()) == [("NodeStarted", 1)]
    plugins.register(PolicyPlugin("b"), name="b", distribution="dist-b")
    with pytest.raises(PluginError, match=r"plugin 'a' and plugin 'b'"):
        plugins.event_upcasters()


def test_import_mayfly_loads_no_plugins() -> None:
    """Importing mayfly loads no entry point, so no backend module is imported."""
    probe = "import sys, mayfly; print(sorted(m for m in sys.modules if m.startswith('mayfly.local')))"
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_list_backends_describes_the_given_url(tmp_path: Path) -> None:
    """Given a URL, the backend serving its scheme describes that store; others describe themselves."""
    rows = list_backends(f"file://{tmp_path}?durability=write")
    local = next(row for row in rows if row.kind == "journal" and row.scheme == "file")
    assert local.plugin == "local"
    assert f"at {tmp_path}, durability write" in local.description


def test_broken_plugin_is_set_aside_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin that fails to import does not take other backends down, and is named on a miss."""
    from importlib.metadata import EntryPoint, entry_points

    import mayfly.plugins as plugins_module

    installed = [ep for ep in entry_points(group="mayfly") if ep.name == "local"]
    broken = EntryPoint(name="broken", value="mayfly_no_such_module_xyz", group="mayfly")
    monkeypatch.setattr(plugins_module, "entry_points", lambda group: [*installed, broken])
    plugins = PluginManager(environ={})
    assert isinstance(plugins.open_journal(str(tmp_path)), LocalWorkflowJournal)
    assert "mayfly_no_such_module_xyz" in plugins.broken_plugins()["broken"]
    with pytest.raises(PluginError, match=r"plugin 'broken' .* failed to import"):
        plugins.open_journal("nosuch://x")
