"""Shared builders for the core tests."""

from __future__ import annotations

from typing import Any

from mayfly.model.spec import DependencyPolicy, Node, RetryPolicy, RunBudgets, WorkflowSpec


def node(
    node_id: str,
    *deps: str,
    policy: DependencyPolicy = "all_succeeded",
    retry: RetryPolicy | None = None,
    **kwargs: Any,
) -> Node:
    """A node running handler ``<id>@1`` that depends on ``deps``."""
    return Node(
        node_id,
        handler=f"{node_id}@1",
        depends_on=tuple(deps),
        policy=policy,
        retry=retry if retry is not None else RetryPolicy(),
        **kwargs,
    )


def workflow(*nodes: Node, budgets: RunBudgets | None = None, **kwargs: Any) -> WorkflowSpec:
    """A spec named ``test.flow`` holding ``nodes``."""
    return WorkflowSpec(
        workflow_id="test.flow",
        version=1,
        nodes=tuple(nodes),
        budgets=budgets if budgets is not None else RunBudgets(),
        **kwargs,
    )
