"""The drive context: shared by every run driven with it, and what a driver reads history through."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import mayfly
from mayfly import ChildCall, ChildDefinition, HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowSpec
from mayfly.commit import commit_command
from mayfly.identity import Uuid7IdSource
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CreateRun, StartNodes
from mayfly.model.errors import CompatibilityError
from mayfly.model.events import EVENT_SCHEMA_VERSIONS, ChildStarted
from mayfly.model.state import RunState, RunStatus
from mayfly.recovery import inspect_run, recovery_effects
from mayfly.runtime import WaitForSignal, WorkflowRuntime, cancel_run_cascade, new_signal_token
from mayfly.runtime._context import DriveContext
from mayfly.runtime._driver import RunDriver
from mayfly.substrate import Hub

LINT = ChildDefinition(
    workflow_id="acme.lint",
    version=1,
    nodes=(Node("scan", handler="scan@1", outputs=("warnings",)),),
    inputs=("repo",),
    outputs=("warnings",),
)
CALL = ChildCall("acme.lint", 1, "require_success", inputs=("repo",), outputs=("warnings",))
PARENT = WorkflowSpec("acme.ci", 1, (Node("lint", child=CALL),), catalog=(LINT,))


class Env:
    def __init__(self, root: Path) -> None:
        url = f"file://{root}/journal?durability=write"
        self.journal = LocalWorkflowJournal(url)
        self.leases = LocalLeaseStore(url)
        self.registry = HandlerRegistry()
        self.tokens: dict[str, str] = {}
        self.registry.register("scan", 1, self.scan)
        self.lifted: list[tuple[str, int]] = []

    def scan(self, req: HandlerRequest) -> Any:
        """Wait for approval once, then succeed with the approved warning count."""
        if req.signal is None:
            token = new_signal_token()
            self.tokens[req.run_id] = token.reveal()
            return WaitForSignal("approval", token)
        return Succeeded(output={"warnings": req.signal.decision["warnings"]})

    def upcasters(self, *event_types: str, record: bool = True) -> dict[tuple[str, int], Any]:
        """Identity upcasters from v1 for ``event_types``, recording each payload they lift."""

        def lift(event_type: str) -> Any:
            def upcast(body: dict[str, Any]) -> dict[str, Any]:
                if record:
                    self.lifted.append((event_type, 1))
                return body

            return upcast

        return {(event_type, 1): lift(event_type) for event_type in event_types}

    def context(self, upcasters: dict[tuple[str, int], Any] | None) -> DriveContext:
        return DriveContext(
            journal=self.journal,
            registry=self.registry,
            ids=Uuid7IdSource(),
            lease_ttl_ms=30_000,
            snapshot_every=1_000,
            leases=self.leases,
            owner="test-owner",
            upcasters=upcasters,
        )

    def drive(self, run_id: str, upcasters: dict[tuple[str, int], Any] | None) -> RunState:
        """Recover ``run_id`` (read with ``upcasters``) and drive it with a context holding none or those."""
        state = inspect_run(
            self.journal, run_id, upcasters=self.upcasters("NodeReady", "ChildStarted", record=False)
        ).state

        def main() -> RunState:
            with self.leases.acquire(run_id, "test-owner", 30_000) as lease:
                driver = RunDriver(self.context(upcasters), state, lease=lease, concurrent=True)
                return driver.drive(recovery_effects(state))

        return Hub().run(main)

    def state(self, run_id: str) -> RunState:
        return inspect_run(
            self.journal, run_id, upcasters=self.upcasters("NodeReady", "ChildStarted", record=False)
        ).state


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def parked_with_an_approved_child(env: Env) -> tuple[str, str]:
    """A parent whose child run accepted its approval signal, both parked: (parent, child) run ids."""
    runtime = WorkflowRuntime(env.journal, env.registry, leases=env.leases)
    parked = runtime.execute(PARENT, {"repo": "acme/app"})
    child_id = str(parked.nodes["lint"].child_run_id)
    assert runtime.signal(child_id, "scan", env.tokens[child_id], {"warnings": 3}).status == "accepted"
    return parked.run_id, child_id


def test_a_drive_context_cannot_change_once_built(env: Env) -> None:
    """Every field is frozen, so the runs that share a context all see the same one."""
    context = env.context(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.owner = "someone-else"  # type: ignore[misc]


def test_a_driver_resumes_a_child_run_through_its_contexts_upcasters(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child run recorded at an older NodeReady version is read through the context's upcasters."""
    parent_id, child_id = parked_with_an_approved_child(env)
    monkeypatch.setitem(EVENT_SCHEMA_VERSIONS, "NodeReady", 2)  # what was written is now v1 of 2
    with pytest.raises(CompatibilityError, match="no upcaster registered for NodeReady v1 -> v2"):
        env.drive(parent_id, None)
    assert env.state(child_id).status is RunStatus.RUNNING  # refused before the child was touched
    env.lifted.clear()
    final = env.drive(parent_id, env.upcasters("NodeReady"))
    assert final.status is RunStatus.SUCCEEDED
    assert env.state(child_id).status is RunStatus.SUCCEEDED
    assert ("NodeReady", 1) in env.lifted


def test_a_child_the_parent_never_created_is_created_from_its_childstarted_read_through_upcasters(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorded ChildStarted a missing child is created from is decoded with the context's upcasters."""
    ids = mayfly.ids.DeterministicIdSource(41)
    run_id = ids.new_id()
    created = commit_command(
        env.journal, None, CreateRun(run_id=run_id, spec=PARENT, input={"repo": "acme/app"}), ids=ids
    )
    start = StartNodes((AttemptStart("lint", ids.new_id(), child_run_id=ids.new_id()),))
    (started,) = [
        e
        for e in commit_command(env.journal, created.state, start, ids=ids).events
        if isinstance(e, ChildStarted)
    ]
    env.registry = HandlerRegistry()
    env.registry.register("scan", 1, lambda req: Succeeded(output={"warnings": 0}))
    monkeypatch.setitem(EVENT_SCHEMA_VERSIONS, "ChildStarted", 2)
    with pytest.raises(CompatibilityError, match="no upcaster registered for ChildStarted v1 -> v2"):
        env.drive(run_id, None)
    assert env.journal.read(started.child_run_id) == []
    env.lifted.clear()
    final = env.drive(run_id, env.upcasters("ChildStarted"))
    assert final.status is RunStatus.SUCCEEDED
    assert env.state(started.child_run_id).status is RunStatus.SUCCEEDED
    assert env.lifted == [("ChildStarted", 1)]


def test_cancel_run_cascade_reads_each_run_through_the_upcasters_it_is_given(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parent and parked child, both recorded at an older NodeReady version, are cancelled via upcasters."""
    runtime = WorkflowRuntime(env.journal, env.registry, leases=env.leases)
    parked = runtime.execute(PARENT, {"repo": "acme/app"})
    child_id = str(parked.nodes["lint"].child_run_id)
    monkeypatch.setitem(EVENT_SCHEMA_VERSIONS, "NodeReady", 2)
    with pytest.raises(CompatibilityError, match="NodeReady v1 -> v2"):
        cancel_run_cascade(
            env.journal,
            env.leases,
            parked.run_id,
            requester="ops",
            reason="x",
            owner="o",
            ids=Uuid7IdSource(),
        )
    cancel_run_cascade(
        env.journal,
        env.leases,
        parked.run_id,
        requester="ops",
        reason="abandoned",
        owner="test-owner",
        ids=Uuid7IdSource(),
        upcasters=env.upcasters("NodeReady"),
    )
    assert env.state(parked.run_id).status is RunStatus.CANCELLED
    assert env.state(child_id).status is RunStatus.CANCELLED
