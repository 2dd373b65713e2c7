"""The Flow builder: the same serializable WorkflowSpec, node handles for dependencies, ids checked with hints."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from mayfly import (
    ChildCall,
    ChildDefinition,
    Edge,
    Flow,
    HandlerRegistry,
    HandlerRequest,
    Node,
    NodeOutcome,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.errors import InvalidIdentifier, SpecValidationError
from mayfly.model.outcomes import NodeOutcomeKind


class Order(msgspec.Struct):
    order_id: str


class Charge(msgspec.Struct):
    charge_id: str


registry = HandlerRegistry()


@registry.handler(version=1)
def charge(order: Order) -> Charge:
    return Charge(charge_id=order.order_id)


@registry.handler(version=2)
def ship(order: Order, *, charge: Charge) -> None:
    return None


@registry.handler("orders.notify", version=1)
def notify(req: HandlerRequest) -> NodeOutcome:
    return Succeeded()


def test_a_flow_builds_the_spec_written_by_hand_with_the_same_json_and_hash() -> None:
    """Handler objects become name@version strings, node handles depends_on ids; JSON and hash match."""
    retry = RetryPolicy(max_attempts=5)
    flow = Flow("orders.fulfil", version=3, budgets=RunBudgets(max_attempts=50))
    paid = flow.node(charge, retry=retry)
    shipped = flow.node(ship, after=[paid], input={"priority": True})
    flow.node(notify, after=[shipped, "charge"], policy="all_completed")
    built = flow.build()
    by_hand = WorkflowSpec(
        workflow_id="orders.fulfil",
        version=3,
        nodes=(
            Node("charge", handler="charge@1", retry=retry),
            Node("ship", handler="ship@2", depends_on=("charge",), input={"priority": True}),
            Node(
                "orders-notify",
                handler="orders.notify@1",
                depends_on=("ship", "charge"),
                policy="all_completed",
            ),
        ),
        budgets=RunBudgets(max_attempts=50),
    )
    assert built == by_hand
    assert built.to_json() == by_hand.to_json()
    assert WorkflowSpec.from_json(built.to_json()).content_hash() == by_hand.content_hash()
    assert registry.missing(built) == []


def test_a_misspelled_string_id_is_refused_at_build_with_the_nearest_id() -> None:
    """Every unknown id is reported at once, each with a did-you-mean hint and its place in the spec."""
    flow = Flow("orders.fulfil", version=1)
    flow.node(charge)
    flow.node(ship, after=["chrage"])
    flow.edge("shipp", "charge", when=OnOutcome(NodeOutcomeKind.PERMANENT_FAILURE))
    with pytest.raises(SpecValidationError) as info:
        flow.build()
    assert [str(issue) for issue in info.value.issues] == [
        "nodes[ship].depends_on[0]: unknown node 'chrage'; did you mean 'charge'?",
        "edges[0].source: unknown node 'shipp'; did you mean 'ship'?",
        "nodes[ship]: handler ship@2 reads the output of node 'charge' (parameter `charge`), which is not "
        "upstream of it; add it to after=",
    ]


def test_an_unknown_id_with_nothing_close_lists_the_flow_nodes() -> None:
    """An id near no node gets the list of the flow's nodes instead of a guess."""
    flow = Flow("orders.fulfil", version=1)
    flow.node(charge)
    flow.node(notify, after=["zzz"])
    with pytest.raises(
        SpecValidationError, match=r"unknown node 'zzz'; the flow's nodes are 'charge', 'orders-notify'"
    ):
        flow.build()


def test_a_typed_handler_reading_an_upstream_output_may_get_it_through_an_edge() -> None:
    """A conditional edge into the node counts as upstream, so the read is satisfied."""
    flow = Flow("orders.fulfil", version=1)
    paid = flow.node(charge)
    shipped = flow.node(ship)
    flow.edge(paid, shipped)
    built = flow.build()
    assert built.edges == (Edge("charge", "ship"),)


def test_a_node_of_another_flow_a_duplicate_id_and_a_bad_handler_are_refused_at_once() -> None:
    """Wrong references fail when the node is added, saying what to do instead."""
    flow, other = Flow("a", version=1), Flow("b", version=1)
    foreign = other.node(charge)
    with pytest.raises(ValueError, match=r"node 'charge' belongs to flow b@1, not a@1"):
        flow.node(ship, after=[foreign])
    flow.node(charge)
    with pytest.raises(ValueError, match=r"already has a node 'charge'; give this one id="):
        flow.node(charge)
    flow.node(charge, id="charge-again")
    with pytest.raises(TypeError, match=r"decorate the function with @registry.handler\(version=1\)"):
        flow.node(lambda req: Succeeded())  # type: ignore[arg-type]  # the point: an unregistered function
    with pytest.raises(InvalidIdentifier):
        flow.node("Not A Ref")
    with pytest.raises(InvalidIdentifier):
        flow.node(charge, id="Bad Id")
    with pytest.raises(TypeError, match="expected a NodeRef"):
        flow.edge(1, "charge")  # type: ignore[arg-type]  # the point: not a reference


def test_a_string_handler_reference_builds_a_node_for_a_handler_registered_elsewhere() -> None:
    """`"name@version"` names a handler this process need not have; the id defaults to its name."""
    flow = Flow("orders.fulfil", version=1)
    flow.node("billing.refund@4")
    assert flow.build().nodes == (Node("billing-refund", handler="billing.refund@4"),)


def test_the_reducer_validation_still_applies_to_a_built_flow() -> None:
    """A cycle of edges with no initial node is refused by the reducer's validation; naming one builds it."""
    flow = Flow("loop", version=1)
    a = flow.node(notify, id="a")
    b = flow.node(notify, id="b")
    flow.edge(a, b)
    flow.edge(b, a)
    with pytest.raises(SpecValidationError):
        flow.build()
    assert flow.build(initial=[a]).initial == ("a",)
    with pytest.raises(SpecValidationError, match=r"initial\[0\]: unknown node 'aa'; did you mean 'a'\?"):
        flow.build(initial=["aa"])


def test_reading_an_upstream_output_as_a_class_its_handler_does_not_return_is_refused_at_build() -> None:
    """ship reads `charge` as a Charge; a node named charge whose handler returns an Order is reported."""
    local = HandlerRegistry()

    @local.handler("charge", version=9)
    def wrong(order: Order) -> Order:
        return order

    flow = Flow("orders.fulfil", version=1)
    flow.node(ship, after=[flow.node(wrong, id="charge")])
    with pytest.raises(SpecValidationError) as info:
        flow.build()
    assert [str(issue) for issue in info.value.issues] == [
        "nodes[ship]: handler ship@2 reads the output of node 'charge' as Charge (parameter `charge`), "
        "but its handler charge@9 returns Order"
    ]
    matching = Flow("orders.fulfil", version=1)
    matching.node(ship, after=[matching.node(charge), matching.node(wrong, id="other")])
    assert [n.id for n in matching.build().nodes] == ["charge", "other", "ship"]


# -- child workflow calls ------------------------------------------------------------------------------


class Repo(msgspec.Struct):
    repo: str


class Scan(msgspec.Struct):
    warnings: int


@registry.handler("acme.scan", version=1)
def scan(source: Repo) -> Scan:
    return Scan(warnings=len(source.repo))


def lint_flow() -> Flow:
    lint = Flow("acme.lint", version=2, inputs=["repo"], outputs=["warnings"])
    lint.node(scan, outputs=["warnings"])
    return lint


def test_a_child_flow_call_builds_the_spec_a_json_child_node_and_catalog_entry_hold(tmp_path: Path) -> None:
    """`Flow.call(child_flow)` is a `child` node plus a catalog entry; the built spec runs the child."""
    flow = Flow("acme.ci", version=1)
    linted = flow.call(lint_flow(), id="lint")
    flow.node(notify, after=[linted])
    built = flow.build()
    by_hand = WorkflowSpec.from_json(
        b"""{"workflow_id": "acme.ci", "version": 1,
        "nodes": [
          {"id": "lint", "child": {"workflow_id": "acme.lint", "version": 2, "mode": "require_success",
                                   "inputs": ["repo"], "outputs": ["warnings"]},
           "outputs": ["warnings"]},
          {"id": "orders-notify", "handler": "orders.notify@1", "depends_on": ["lint"]}],
        "catalog": [{"workflow_id": "acme.lint", "version": 2, "inputs": ["repo"], "outputs": ["warnings"],
                     "nodes": [{"id": "acme-scan", "handler": "acme.scan@1", "outputs": ["warnings"]}]}]}"""
    )
    assert built == by_hand and built.to_json() == by_hand.to_json()
    assert built.content_hash() == by_hand.content_hash()
    result = WorkflowRuntime(f"file://{tmp_path}/journal", registry).execute(built, input={"repo": "mayfly"})
    assert result.succeeded and result.outputs["lint"] == {"warnings": 6}


def test_a_call_picks_fields_and_mode_and_nested_calls_reach_the_root_catalog() -> None:
    """`inputs=`/`outputs=`/`mode=` shape the ChildCall; a child's own callees join the root catalog."""
    middle = Flow("acme.review", version=1, inputs=["repo"], outputs=["warnings"])
    middle.call(lint_flow(), id="lint", outputs=["warnings"])
    root = Flow("acme.ci", version=1)
    root.call(middle, id="review", mode="propagate", inputs=["repo"], input={"repo": "fixed"})
    spec = root.build()
    (node,) = spec.nodes
    assert node.child == ChildCall("acme.review", 1, "propagate", inputs=("repo",), outputs=("warnings",))
    assert node.input == {"repo": "fixed"}
    assert [(c.workflow_id, c.version) for c in spec.catalog] == [("acme.lint", 2), ("acme.review", 1)]


def test_calls_are_refused_for_a_handler_a_clashing_definition_and_the_flow_itself() -> None:
    """A handler is not a workflow; one catalog holds one definition per id and version; no self-calls."""
    flow = Flow("acme.ci", version=1)
    with pytest.raises(TypeError, match=r"Flow\.call takes a Flow or a ChildDefinition, got Handler"):
        flow.call(scan)  # type: ignore[arg-type]
    flow.call(lint_flow(), id="lint")
    other = Flow("acme.lint", version=2)
    other.node(notify)
    with pytest.raises(ValueError, match=r"already calls a different acme\.lint@2"):
        flow.call(other, id="lint-again")
    with pytest.raises(ValueError, match="already has a node 'lint'"):
        flow.call(lint_flow(), id="lint")
    itself = Flow("acme.ci", version=1)
    itself.node(notify)
    with pytest.raises(ValueError, match="cannot call itself"):
        flow.call(itself, id="me")
    unknown = Flow("acme.ci", version=2)
    unknown.call(ChildDefinition("acme.lint", 2, nodes=(Node("scan", handler="acme.scan@1"),)), after=["lnt"])
    with pytest.raises(SpecValidationError, match=r"depends_on\[0\]: unknown node 'lnt'"):
        unknown.build()
