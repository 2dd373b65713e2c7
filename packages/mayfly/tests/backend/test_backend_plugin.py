"""backend_hooks: a storage backend's whole plugin in one call, loaded by the plugin manager like any other."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from mayfly.backend import backend_hooks
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.plugins import PluginManager


def _manager(**hooks: object) -> PluginManager:
    """A manager with one plugin module holding the API declaration and ``hooks``, as a backend's would."""
    module = ModuleType("kit_plugin")
    module.MAYFLY_PLUGIN_API = 1  # type: ignore[attr-defined]  # set as a plugin module does
    for name, hook in hooks.items():
        setattr(module, name, hook)
    manager = PluginManager(load_entry_points=False)
    manager.register(module, name="kit", distribution="kit-dist")
    return manager


def test_the_two_hooks_offer_the_journal_and_the_leases(tmp_path: Path) -> None:
    """Both hooks are pluggy implementations; the manager opens the backend's journal and leases by scheme."""
    journals, leases = backend_hooks(("kit",), "kit-dist", LocalWorkflowJournal, LocalLeaseStore)
    manager = _manager(mayfly_journal_backends=journals, mayfly_lease_backends=leases)
    url = f"kit://{tmp_path}/j"
    opened = [descriptor.open(f"file://{tmp_path}/j") for descriptor in journals()]
    assert [type(journal) for journal in opened] == [LocalWorkflowJournal]
    for journal in opened:
        journal.close()  # type: ignore[attr-defined]  # the descriptor's open returns object
    rows = {(row.kind, row.scheme, row.distribution) for row in manager.list_backends(url)}
    assert rows == {("journal", "kit", "kit-dist"), ("lease", "kit", "kit-dist")}


def test_the_summary_describes_the_bare_scheme_and_describe_a_url() -> None:
    """mayfly backends prints the summary without a URL and describe(url) for a URL of the scheme."""
    journals, leases = backend_hooks(
        ("kit",),
        "kit-dist",
        LocalWorkflowJournal,
        LocalLeaseStore,
        describe=lambda url: f"kit store at {url}",
        summary="kit stores, in general",
    )
    manager = _manager(mayfly_journal_backends=journals, mayfly_lease_backends=leases)
    assert {row.description for row in manager.list_backends()} == {"kit stores, in general"}
    assert {row.description for row in manager.list_backends("kit:///srv/x")} == {"kit store at kit:///srv/x"}


def test_a_backend_without_leases_offers_none() -> None:
    """leases=None gives a lease hook that returns no descriptor."""
    journals, leases = backend_hooks(("kit",), "kit-dist", LocalWorkflowJournal, summary="journal only")
    manager = _manager(mayfly_journal_backends=journals, mayfly_lease_backends=leases)
    assert {row.kind for row in manager.list_backends()} == {"journal"}
    assert leases() == []
