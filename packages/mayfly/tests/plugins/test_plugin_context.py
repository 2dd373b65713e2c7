"""The plugin context: a runtime and every CLI command take one, and every hook family reaches them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from installed import v1_fixture

import mayfly.runtime.runtime
import mayfly.telemetry
from mayfly import (
    ChildCall,
    ChildDefinition,
    HandlerRegistry,
    HandlerRequest,
    Node,
    Succeeded,
    WaitForSignal,
    WorkflowRuntime,
    WorkflowSpec,
    new_signal_token,
)
from mayfly.cli import main
from mayfly.errors import (
    BackendNotInstalled,
    CompatibilityError,
    PluginError,
    SpecValidationError,
    ValidationIssue,
)
from mayfly.hookspecs import BackendDescriptor, hookimpl
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.events import EVENT_SCHEMA_VERSIONS
from mayfly.plugins import PluginManager, plugin_manager


def context(*plugins: object) -> PluginManager:
    """A plugin context holding exactly ``plugins`` (no entry points)."""
    manager = PluginManager(load_entry_points=False, environ={})
    for index, plugin in enumerate(plugins):
        manager.register(plugin, name=f"p{index}", distribution=f"dist-{index}")
    return manager


def _file_url(url: str) -> str:
    return "file://" + url.split("://", 1)[1]


class AcmeStore:
    """Serves acme:// URLs with the local file journal and leases."""

    MAYFLY_PLUGIN_API = 1

    @hookimpl
    def mayfly_journal_backends(self) -> Sequence[BackendDescriptor]:
        return [BackendDescriptor(("acme",), "acme-store", lambda url: LocalWorkflowJournal(_file_url(url)))]

    @hookimpl
    def mayfly_lease_backends(self) -> Sequence[BackendDescriptor]:
        return [BackendDescriptor(("acme",), "acme-store", lambda url: LocalLeaseStore(_file_url(url)))]


class NoWipes:
    """Refuses nodes named ``wipe``."""

    MAYFLY_PLUGIN_API = 1

    @hookimpl
    def mayfly_validate_spec(self, spec: Any) -> Sequence[ValidationIssue]:
        return [ValidationIssue(f"nodes[{n.id}]", "no wipes here") for n in spec.nodes if n.id == "wipe"]


class Crashing:
    """A validator with a bug."""

    MAYFLY_PLUGIN_API = 1

    @hookimpl
    def mayfly_validate_spec(self, spec: Any) -> Sequence[ValidationIssue]:
        raise KeyError("nodes")


class NodeReadyUpcaster:
    """Lifts NodeReady v1 (``node``) to v2 (``node_id``)."""

    MAYFLY_PLUGIN_API = 1

    @hookimpl
    def mayfly_event_upcasters(self) -> Mapping[tuple[str, int], Callable[[Any], Any]]:
        return {
            ("NodeReady", 1): lambda body: {
                "node_id": body["node"],
                "cause": body["cause"],
                "type": "NodeReady",
            }
        }


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()
    handlers.register("a", 1, lambda req: Succeeded())
    handlers.register("b", 1, lambda req: Succeeded())
    return handlers


def test_the_runtime_opens_urls_through_its_plugin_context(tmp_path: Path) -> None:
    """A scheme only the given context serves opens; an empty context serves not even file://."""
    runtime = WorkflowRuntime(f"acme://{tmp_path}/journal", registry(), plugins=context(AcmeStore()))
    spec = WorkflowSpec(workflow_id="acme.flow", version=1, nodes=(Node("a", handler="a@1"),))
    assert runtime.execute(spec).succeeded
    assert isinstance(runtime.journal, LocalWorkflowJournal)
    with pytest.raises(BackendNotInstalled, match="acme://"):
        WorkflowRuntime(f"acme://{tmp_path}/journal", registry())  # the process's manager has no acme
    with pytest.raises(BackendNotInstalled, match="file://"):
        WorkflowRuntime(f"file://{tmp_path}/journal", registry(), plugins=context())
    assert WorkflowRuntime(f"file://{tmp_path}/journal").plugins is plugin_manager()


def test_no_process_wide_setter_connects_the_runtime_or_telemetry_to_the_plugins() -> None:
    """The setters `import mayfly` used to install are gone from the runtime and telemetry."""
    assert not hasattr(mayfly.runtime.runtime, "set_backend_resolver")
    assert not hasattr(mayfly.runtime, "set_backend_resolver")
    assert not hasattr(mayfly.telemetry, "set_metrics_publisher")


def test_plugin_validators_refuse_a_spec_in_execute_and_validate(tmp_path: Path) -> None:
    """execute raises SpecValidationError with the plugin's issue, and writes nothing; validate lists it."""
    runtime = WorkflowRuntime(
        f"acme://{tmp_path}/journal", registry(), plugins=context(AcmeStore(), NoWipes())
    )
    spec = WorkflowSpec(workflow_id="acme.flow", version=1, nodes=(Node("wipe", handler="a@1"),))
    assert [str(issue) for issue in runtime.validate(spec)] == ["nodes[wipe]: no wipes here"]
    with pytest.raises(SpecValidationError, match=r"nodes\[wipe\]: no wipes here"):
        runtime.execute(spec)
    assert runtime.journal.list_runs() == []
    broken = WorkflowSpec(
        workflow_id="acme.flow", version=1, nodes=(Node("wipe", handler="a@1", depends_on=("x",)),)
    )
    issues = [str(issue) for issue in runtime.plugins.validate(broken)]
    assert (
        len(issues) == 2 and issues[-1] == "nodes[wipe]: no wipes here"
    )  # the core's issue, then the plugin's


def test_a_crashing_validator_is_a_plugin_error_naming_it(tmp_path: Path) -> None:
    """A validator that raises is never taken for one that found nothing."""
    spec = WorkflowSpec(workflow_id="acme.flow", version=1, nodes=(Node("a", handler="a@1"),))
    with pytest.raises(PluginError, match=r"plugin 'p0' raised KeyError in mayfly_validate_spec"):
        context(Crashing()).ensure_valid(spec)


def test_the_cli_runs_every_command_with_the_given_context(tmp_path: Path) -> None:
    """`main(..., plugins=...)` refuses a spec by the context's validator with exit 2 and its message."""
    spec = {"workflow_id": "acme.flow", "version": 1, "nodes": [{"id": "wipe", "handler": "a@1"}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "handlers.py").write_text(
        "from mayfly import HandlerRegistry, Succeeded\nregistry = HandlerRegistry()\n"
        "registry.register('a', 1, lambda req: Succeeded())\n"
    )
    url = f"acme://{tmp_path}/journal"
    out, err = io.StringIO(), io.StringIO()
    argv = ["--journal", url, "run", str(tmp_path / "spec.json"), "--handlers", str(tmp_path / "handlers.py")]
    assert main(argv, out=out, err=err, plugins=context(AcmeStore(), NoWipes())) == 2
    assert err.getvalue() == (
        "mayfly: error: invalid workflow specification (1 problem(s)): nodes[wipe]: no wipes here\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert main(argv, out=out, err=err, plugins=context(AcmeStore())) == 0, err.getvalue()
    assert main(["--journal", url, "runs"], out=out, err=io.StringIO(), plugins=context()) == 2


def test_upcasters_of_the_context_apply_to_inspect_replay_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With NodeReady at v2, a v1 history reads through the context's upcaster, and fails closed without it."""
    url = f"file://{tmp_path}/journal"
    run_id = v1_fixture(url)
    monkeypatch.setitem(EVENT_SCHEMA_VERSIONS, "NodeReady", 2)
    journal, leases = LocalWorkflowJournal(url), LocalLeaseStore(url)
    bare = WorkflowRuntime(journal, registry(), leases=leases, plugins=context())
    for read in (bare.replay, bare.inspect, bare.resume):
        with pytest.raises(CompatibilityError, match="no upcaster registered for NodeReady v1 -> v2"):
            read(run_id)
    runtime = WorkflowRuntime(journal, registry(), leases=leases, plugins=context(NodeReadyUpcaster()))
    assert [n.status.value for n in runtime.replay(run_id).state.nodes] == ["succeeded", "ready"]
    assert runtime.inspect(run_id).state.sequence == 5
    assert runtime.resume(run_id).succeeded


def test_an_upcaster_key_that_is_not_a_type_and_version_is_refused() -> None:
    """A mapping key other than (event_type, from_version), or a non-callable upcaster, names its plugin."""

    class Bad:
        MAYFLY_PLUGIN_API = 1

        @hookimpl
        def mayfly_event_upcasters(self) -> Mapping[object, object]:
            return {"NodeReady": lambda body: body}

    with pytest.raises(PluginError, match=r"plugin 'p0' returned 'NodeReady'"):
        context(Bad()).event_upcasters()


def test_the_demo_is_not_a_plugin() -> None:
    """No entry point publishes the demo, so its handlers land in no registry the plugins fill."""
    manager = PluginManager(environ={})
    assert "demo" not in manager.plugin_names()
    handlers = HandlerRegistry()
    manager.register_handlers(handlers)
    assert handlers.resolve("demo.plan@1") is None


class SameShapeSignalWaitOpened:
    """An upcaster for a SignalWaitOpened v2 that kept v1's shape."""

    MAYFLY_PLUGIN_API = 1

    @hookimpl
    def mayfly_event_upcasters(self) -> Mapping[tuple[str, int], Callable[[Any], Any]]:
        return {("SignalWaitOpened", 1): lambda body: body}


def test_child_runs_are_resumed_through_the_runtimes_plugin_upcasters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming a parent reads its parked child's older history through the runtime's plugin context.

    Only the child recorded a SignalWaitOpened, so only the child's read needs the upcaster.
    """
    lint = ChildDefinition("acme.lint", 1, (Node("scan", handler="a@1"),))
    parent = WorkflowSpec(
        "acme.ci", 1, (Node("lint", child=ChildCall("acme.lint", 1, "require_success")),), catalog=(lint,)
    )
    url = f"file://{tmp_path}/journal"
    journal, leases = LocalWorkflowJournal(url), LocalLeaseStore(url)
    tokens: dict[str, str] = {}

    def scan(req: HandlerRequest) -> Any:
        if req.signal is None:
            token = new_signal_token()
            tokens[req.run_id] = token.reveal()
            return WaitForSignal("go", token)
        return Succeeded()

    handlers = HandlerRegistry()
    handlers.register("a", 1, scan)
    first = WorkflowRuntime(journal, handlers, leases=leases, plugins=context())
    parked = first.execute(parent)
    child_id = str(parked.nodes["lint"].child_run_id)
    assert first.signal(child_id, "scan", tokens[child_id], "yes").status == "accepted"
    monkeypatch.setitem(EVENT_SCHEMA_VERSIONS, "SignalWaitOpened", 2)
    bare = WorkflowRuntime(journal, handlers, leases=leases, plugins=context())
    assert bare.inspect(parked.run_id).state.status.value == "running"  # the parent reads without it
    with pytest.raises(CompatibilityError, match="SignalWaitOpened v1 -> v2"):
        bare.resume(parked.run_id)
    runtime = WorkflowRuntime(journal, handlers, leases=leases, plugins=context(SameShapeSignalWaitOpened()))
    assert runtime.resume(parked.run_id).succeeded
    assert runtime.inspect(child_id).state.status.value == "succeeded"
