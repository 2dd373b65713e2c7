"""What a type checker sees of the typed handler API; mypy --strict must accept all of it (test_typing.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, assert_type

import msgspec

from mayfly import Flow, Handler, HandlerRegistry, HandlerRequest, NodeOutcome, RetryableFailure, Succeeded
from mayfly.flow import NodeRef
from mayfly.model.spec import WorkflowSpec


class Order(msgspec.Struct):
    order_id: str
    amount: int


class Charge(msgspec.Struct):
    charge_id: str


class ReadsCharge(Protocol):
    def __call__(self, order: Order, /, *, charge: Charge) -> dict[str, str]: ...


registry = HandlerRegistry()


@registry.handler(version=1)
def charge(order: Order, req: HandlerRequest) -> Charge | RetryableFailure:
    return Charge(charge_id=req.idempotency_key)


@registry.handler(version=1)
def ship(order: Order, *, charge: Charge) -> dict[str, str]:
    return {"order": order.order_id, "charge": charge.charge_id}


@registry.handler("legacy.review", version=2)
def review(req: HandlerRequest) -> NodeOutcome:
    return Succeeded(output=req.node_id)


# A Handler keeps the function's signature: it is the callable it decorates, to the type checker too.
as_written: Callable[[Order, HandlerRequest], Charge | RetryableFailure] = charge
reads_charge: ReadsCharge = ship
request_style: Handler[[HandlerRequest], NodeOutcome] = review
any_handler: Handler[..., Any] = ship


def calls(req: HandlerRequest) -> None:
    assert_type(charge(Order("o", 1), req), Charge | RetryableFailure)
    assert_type(ship(Order("o", 1), charge=Charge("c")), dict[str, str])
    assert_type(review(req), NodeOutcome)


assert_type(charge.ref, str)
assert_type(charge.version, int)

flow = Flow("orders.fulfil", version=1)
paid = flow.node(charge)
shipped = flow.node(ship, after=[paid])
reviewed = flow.node(review, after=[shipped, "charge"])
assert_type(paid, NodeRef)
assert_type(flow.node("billing.refund@1"), NodeRef)
flow.edge(shipped, reviewed)
lint = Flow("acme.lint", version=1, inputs=["repo"], outputs=["warnings"])
lint.node(review)
assert_type(flow.call(lint, after=[reviewed], mode="propagate"), NodeRef)
assert_type(flow.build(), WorkflowSpec)
