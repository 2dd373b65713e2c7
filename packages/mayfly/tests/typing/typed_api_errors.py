"""Misuses of the typed handler API that mypy --strict must report, each on the line its `# E:` names."""

from __future__ import annotations

import msgspec

from mayfly import Flow, HandlerRegistry


class Order(msgspec.Struct):
    order_id: str


class Charge(msgspec.Struct):
    charge_id: str


registry = HandlerRegistry()


@registry.handler(version=1)
def charge(order: Order) -> Charge:
    return Charge(charge_id=order.order_id)


@registry.handler()  # E: call-overload untyped-decorator
def nameless(order: Order) -> Charge:
    return Charge(charge_id="c")


charge("not an order")  # E: arg-type
total: int = charge(Order("o"))  # E: assignment

flow = Flow("orders.fulfil", version=1)
paid = flow.node(charge)
flow.node(charge, id="again", after=[piad])  # noqa: F821  # E: name-defined
flow.node(charge, id="twice", after=[1])  # E: list-item
flow.node(lambda req: None)  # E: arg-type
flow.edge(paid, 2)  # E: arg-type
flow.call(charge)  # E: arg-type
flow.call(Flow("acme.lint", version=1), mode="ignore")  # E: arg-type
