"""Typed handlers: inputs and upstream outputs decoded into annotated types, outputs checked, mismatches located."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, TypedDict

import msgspec
import pytest

import mayfly
from mayfly import (
    Handler,
    HandlerRegistry,
    HandlerRequest,
    Node,
    NodeOutcome,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.model.spec import ImmediateBackoff


class Order(msgspec.Struct):
    order_id: str
    amount: int


class Charge(msgspec.Struct):
    charge_id: str
    amount: int


@dataclasses.dataclass
class Parcel:
    order_id: str
    weight_g: int


class Label(TypedDict):
    carrier: str
    tracking: str


class Unsupported:  # a plain class: msgspec cannot decode JSON into it
    pass


FAST = RetryPolicy(max_attempts=3, backoff=ImmediateBackoff())


def spec(*nodes: Node) -> WorkflowSpec:
    return WorkflowSpec(workflow_id="typed.test", version=1, nodes=nodes)


def run(
    tmp_path: Path, registry: HandlerRegistry, workflow: WorkflowSpec, input: Any
) -> tuple[mayfly.RunResult, WorkflowRuntime]:
    runtime = WorkflowRuntime(f"file://{tmp_path}/journal", registry)
    return runtime.execute(workflow, input=input), runtime


def outcome(runtime: WorkflowRuntime, run_id: str, node_id: str) -> NodeOutcome:
    node = runtime.inspect(run_id).state.node_by_id(node_id)
    assert node is not None and node.last_outcome is not None
    return node.last_outcome


def test_the_run_input_and_an_upstream_output_are_decoded_and_the_output_encoded(tmp_path: Path) -> None:
    """The positional parameter gets the run input as an Order, the keyword-only one charge's output as a Charge."""
    registry = HandlerRegistry()
    seen: list[object] = []

    @registry.handler(version=1)
    def charge(order: Order) -> Charge:
        seen.append(order)
        return Charge(charge_id=f"ch-{order.order_id}", amount=order.amount)

    @registry.handler(version=1)
    def ship(order: Order, *, charge: Charge) -> Parcel:
        seen.append(charge)
        return Parcel(order_id=order.order_id, weight_g=charge.amount * 10)

    workflow = spec(
        Node("charge", handler="charge@1"), Node("ship", handler="ship@1", depends_on=("charge",))
    )
    result, _ = run(tmp_path, registry, workflow, {"order_id": "o-7", "amount": 12})
    assert result.status is RunStatus.SUCCEEDED
    assert seen == [Order("o-7", 12), Charge("ch-o-7", 12)]
    assert result.outputs == {
        "charge": {"charge_id": "ch-o-7", "amount": 12},
        "ship": {"order_id": "o-7", "weight_g": 120},
    }


def test_an_input_that_does_not_match_fails_permanently_naming_the_location(tmp_path: Path) -> None:
    """A string amount is a PermanentFailure naming the handler, the type and $.amount, with no retry."""
    registry = HandlerRegistry()
    calls: list[Order] = []

    @registry.handler(version=1)
    def charge(order: Order) -> Charge:
        calls.append(order)
        return Charge(charge_id="never", amount=order.amount)

    result, runtime = run(
        tmp_path,
        registry,
        spec(Node("charge", handler="charge@1", retry=FAST)),
        {"order_id": "o", "amount": "12"},
    )
    assert result.status is RunStatus.FAILED
    assert calls == []
    assert result.nodes["charge"].attempts == 1
    assert outcome(runtime, result.run_id, "charge") == PermanentFailure(
        reason="input of charge@1 does not match Order: Expected `int`, got `str` at $.amount"
    )


def test_a_missing_field_and_a_wrong_shape_are_located_at_the_root(tmp_path: Path) -> None:
    """An object missing a required field, or no object at all, names $ and what was expected."""
    registry = HandlerRegistry()
    registry.handler(version=1)(charge_of)
    for i, (value, reason) in enumerate(
        [
            ({"order_id": "o"}, "Object missing required field `amount` at $"),
            ([1, 2], "Expected `object`, got `array` at $"),
        ]
    ):
        result, runtime = run(tmp_path / str(i), registry, spec(Node("n", handler="charge_of@1")), value)
        assert result.status is RunStatus.FAILED
        assert outcome(runtime, result.run_id, "n") == PermanentFailure(
            reason=f"input of charge_of@1 does not match Order: {reason}"
        )


def charge_of(order: Order) -> Charge:
    return Charge(charge_id="c", amount=order.amount)


def test_an_upstream_output_that_does_not_match_fails_naming_the_node(tmp_path: Path) -> None:
    """A request-style upstream whose output is no Charge fails the typed reader, naming the node and place."""
    registry = HandlerRegistry()
    registry.register("charge", 1, lambda req: Succeeded(output={"charge_id": 5, "amount": 1}))

    @registry.handler(version=1)
    def ship(order: Order, *, charge: Charge) -> None:
        raise AssertionError("not reached")

    workflow = spec(
        Node("charge", handler="charge@1"), Node("ship", handler="ship@1", depends_on=("charge",))
    )
    result, runtime = run(tmp_path, registry, workflow, {"order_id": "o", "amount": 1})
    assert outcome(runtime, result.run_id, "ship") == PermanentFailure(
        reason="output of node 'charge' read by ship@1 does not match Charge: Expected `str`, got `int` "
        "at $.charge_id"
    )


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        (Charge(charge_id="c", amount="12"), "Expected `int`, got `str` at $.amount"),  # type: ignore[arg-type]
        ({"charge_id": "c"}, "Object missing required field `amount` at $"),
        ("a string", "Expected `object`, got `str` at $"),
        (Succeeded(output={"charge_id": "c", "amount": None}), "Expected `int`, got `null` at $.amount"),
    ],
    ids=["struct-with-a-wrong-field", "dict-missing-a-field", "plain-value", "succeeded-output"],
)
def test_an_output_that_does_not_match_the_return_type_is_a_located_failure(
    tmp_path: Path, returned: object, reason: str
) -> None:
    """Whatever the handler returns is checked against its return type, a Succeeded's output included."""
    registry = HandlerRegistry()

    @registry.handler(version=1)
    def charge(order: Order) -> Charge | Succeeded:
        return returned  # type: ignore[return-value]  # the point: a mismatch the runtime catches

    result, runtime = run(
        tmp_path,
        registry,
        spec(Node("charge", handler="charge@1", retry=FAST)),
        {"order_id": "o", "amount": 1},
    )
    assert result.status is RunStatus.FAILED
    assert result.nodes["charge"].attempts == 1
    assert outcome(runtime, result.run_id, "charge") == PermanentFailure(
        reason=f"charge@1 returned an output that does not match Charge: {reason}"
    )


def test_an_output_json_cannot_hold_is_a_permanent_failure(tmp_path: Path) -> None:
    """A returned object msgspec cannot encode fails the attempt permanently, naming its type."""
    registry = HandlerRegistry()

    @registry.handler(version=1)
    def make(order: Order) -> Any:
        return Unsupported()

    result, runtime = run(
        tmp_path, registry, spec(Node("make", handler="make@1")), {"order_id": "o", "amount": 1}
    )
    failed = outcome(runtime, result.run_id, "make")
    assert isinstance(failed, PermanentFailure)
    assert failed.reason.startswith("make@1 returned Unsupported, which is not JSON-serializable: ")


def test_a_declared_outcome_passes_through_and_is_retried(tmp_path: Path) -> None:
    """A handler declaring `-> Charge | RetryableFailure` may return the failure; the retry policy decides."""
    registry = HandlerRegistry()
    keys: list[str] = []

    @registry.handler(version=1)
    def charge(order: Order, req: HandlerRequest) -> Charge | RetryableFailure:
        keys.append(req.idempotency_key)
        if req.attempt == 1:
            return RetryableFailure(reason="gateway busy")
        return Charge(charge_id=req.idempotency_key, amount=order.amount)

    result, _ = run(
        tmp_path,
        registry,
        spec(Node("charge", handler="charge@1", retry=FAST)),
        {"order_id": "o", "amount": 3},
    )
    assert result.status is RunStatus.SUCCEEDED
    assert result.nodes["charge"].attempts == 2
    assert len(set(keys)) == 2  # each attempt has its own key, and the handler saw it
    assert result.outputs["charge"] == {"charge_id": keys[1], "amount": 3}


def test_dataclasses_and_typed_dicts_are_inputs_and_outputs(tmp_path: Path) -> None:
    """A dataclass input and a TypedDict output are decoded and checked like Structs."""
    registry = HandlerRegistry()

    @registry.handler(version=1)
    def label(parcel: Parcel) -> Label:
        return {"carrier": "post", "tracking": f"{parcel.order_id}/{parcel.weight_g}"}

    @registry.handler(version=1)
    def broken(parcel: Parcel) -> Label:
        return {"carrier": "post"}  # type: ignore[typeddict-item]  # the runtime catches it too

    workflow = spec(Node("label", handler="label@1"), Node("broken", handler="broken@1"))
    result, runtime = run(tmp_path, registry, workflow, {"order_id": "o", "weight_g": 250})
    assert result.outputs["label"] == {"carrier": "post", "tracking": "o/250"}
    assert outcome(runtime, result.run_id, "broken") == PermanentFailure(
        reason="broken@1 returned an output that does not match Label: Object missing required field "
        "`tracking` at $"
    )


def test_the_node_input_overlays_the_run_input(tmp_path: Path) -> None:
    """The input parameter reads the run input object overlaid with the node's own input object."""
    registry = HandlerRegistry()

    @registry.handler(version=1)
    def charge(order: Order) -> Charge:
        return Charge(charge_id=order.order_id, amount=order.amount)

    workflow = spec(Node("charge", handler="charge@1", input={"amount": 99}))
    result, _ = run(tmp_path, registry, workflow, {"order_id": "o", "amount": 1})
    assert result.outputs["charge"] == {"charge_id": "o", "amount": 99}


def test_a_dashed_node_id_feeds_an_underscored_parameter_and_a_default_stands_in(tmp_path: Path) -> None:
    """`reserve_stock` reads node reserve-stock; a defaulted parameter whose node failed gets its default."""
    registry = HandlerRegistry()
    registry.register("reserve", 1, lambda req: Succeeded(output={"charge_id": "r", "amount": 2}))
    registry.register("audit", 1, lambda req: PermanentFailure(reason="audit down"))

    @registry.handler(version=1)
    def pack(*, reserve_stock: Charge, audit: Charge | None = None) -> dict[str, object]:
        return {"reserved": reserve_stock.amount, "audited": audit is not None}

    workflow = spec(
        Node("reserve-stock", handler="reserve@1"),
        Node("audit", handler="audit@1"),
        Node("pack", handler="pack@1", depends_on=("reserve-stock", "audit"), policy="all_completed"),
    )
    result, _ = run(tmp_path, registry, workflow, None)
    assert result.outputs["pack"] == {"reserved": 2, "audited": False}


def test_a_required_upstream_that_is_not_a_prerequisite_fails_with_what_to_do(tmp_path: Path) -> None:
    """A keyword-only parameter naming no succeeded prerequisite fails the attempt, saying to add it."""
    registry = HandlerRegistry()

    @registry.handler(version=1)
    def ship(*, charge: Charge) -> None:
        raise AssertionError("not reached")

    result, runtime = run(tmp_path, registry, spec(Node("ship", handler="ship@1")), None)
    assert outcome(runtime, result.run_id, "ship") == PermanentFailure(
        reason="ship@1 reads the output of node 'charge' (parameter `charge`), which is not a succeeded "
        "prerequisite of node 'ship'; add it to the node's depends_on (after=)"
    )


def test_request_style_handlers_are_called_with_the_request_as_before(tmp_path: Path) -> None:
    """Unannotated, HandlerRequest- and Any-annotated handlers and lambdas get the request and return outcomes."""
    registry = HandlerRegistry()
    got: list[object] = []

    def plain(req):  # type: ignore[no-untyped-def]  # the untyped style stays supported
        got.append(type(req))
        return Succeeded(output=1)

    def annotated(req: HandlerRequest) -> NodeOutcome:
        got.append(type(req))
        return Succeeded(output=2)

    def loose(req: Any) -> Any:
        got.append(type(req))
        return Succeeded(output=3)

    registry.register("plain", 1, plain)
    registry.register("annotated", 1, annotated)
    registry.register("loose", 1, loose)
    registry.register("lam", 1, lambda req: Succeeded(output=req.node_id))
    for name in ("plain", "annotated", "loose", "lam"):
        entry = registry.resolve(f"{name}@1")
        assert entry is not None and entry.typed is None and entry.fn is not None
    workflow = spec(*(Node(n, handler=f"{n}@1") for n in ("plain", "annotated", "loose", "lam")))
    result, _ = run(tmp_path, registry, workflow, None)
    assert result.outputs == {"plain": 1, "annotated": 2, "loose": 3, "lam": "lam"}
    assert got == [HandlerRequest] * 3


def test_the_decorator_names_the_handler_for_its_function_and_keeps_it_callable() -> None:
    """@registry.handler(version=2) registers charge@2 and returns a Handler calling the function as written."""
    registry = HandlerRegistry()

    @registry.handler(version=2)
    def charge(order: Order) -> Charge:
        """Charge the card."""
        return Charge(charge_id="c", amount=order.amount)

    assert isinstance(charge, Handler)
    assert (charge.name, charge.version, charge.ref, str(charge)) == ("charge", 2, "charge@2", "charge@2")
    assert charge.__name__ == "charge" and charge.__doc__ == "Charge the card."
    assert charge(Order("o", 4)) == Charge("c", 4)
    assert "charge@2" in registry and registry.resolve("charge@2") is charge.entry

    @registry.handler("legacy.review", version=1)
    def review(req: HandlerRequest) -> NodeOutcome:
        return Succeeded()

    assert review.ref == "legacy.review@1" and review.entry.fn is review.fn


@pytest.mark.parametrize(
    ("define", "message"),
    [
        ("def h(a: Order, b: Order) -> Charge: ...", "parameter `b` is a second positional parameter"),
        ("def h(*orders: Order) -> Charge: ...", "*args and **kwargs cannot be typed inputs"),
        ("def h(order: Unsupported) -> Charge: ...", "parameter `order` cannot be decoded from JSON"),
        ("def h(order: Order) -> Unsupported: ...", "the return type cannot be decoded from JSON"),
        ("def h(order: 'Missing') -> Charge: ...", "cannot resolve its type hints (NameError"),
    ],
    ids=["two-positional", "var-positional", "unsupported-input", "unsupported-output", "unresolvable"],
)
def test_a_signature_the_runtime_cannot_serve_is_refused_at_registration(define: str, message: str) -> None:
    """Registration raises TypeError naming the handler and the problem, before any run reaches it."""
    namespace: dict[str, Any] = {"Order": Order, "Charge": Charge, "Unsupported": Unsupported}
    exec(define, namespace)
    with pytest.raises(TypeError, match=r"^handler h@1: ") as info:
        HandlerRegistry().register("h", 1, namespace["h"])
    assert message in str(info.value)


def test_the_decorator_without_a_name_needs_a_version_and_a_valid_function_name() -> None:
    """No name and no version is refused; so is a function name outside the handler grammar."""
    registry = HandlerRegistry()
    with pytest.raises(TypeError, match=r"needs version=: @registry.handler\(version=1\)"):
        registry.handler()  # type: ignore[call-overload]  # the missing version is the point
    with pytest.raises(TypeError, match="'ChargeCard' is not a valid handler name"):

        @registry.handler(version=1)
        def ChargeCard(order: Order) -> Charge:
            return Charge(charge_id="c", amount=1)

    assert len(registry) == 0


def test_mayfly_run_serves_typed_handlers_from_a_built_json_spec(tmp_path: Path) -> None:
    """A Flow-built spec written as JSON runs under `mayfly run` with a typed handlers module."""
    handlers = tmp_path / "shop.py"
    handlers.write_text(
        textwrap.dedent(
            """
            import msgspec
            import mayfly

            class Order(msgspec.Struct):
                order_id: str
                amount: int

            class Charge(msgspec.Struct):
                charge_id: str
                amount: int

            registry = mayfly.HandlerRegistry()

            @registry.handler(version=1)
            def charge(order: Order) -> Charge:
                return Charge(charge_id="ch-" + order.order_id, amount=order.amount)

            @registry.handler(version=1)
            def receipt(order: Order, *, charge: Charge) -> dict[str, str]:
                return {"text": f"{order.order_id} paid {charge.amount} ({charge.charge_id})"}

            flow = mayfly.Flow("shop.checkout", version=1)
            receipt_node = flow.node(receipt, after=[flow.node(charge)])
            SPEC = flow.build()
            """
        ),
        encoding="utf-8",
    )
    make_spec = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import shop; sys.stdout.buffer.write(shop.SPEC.to_json())"
    spec_json = subprocess.run([sys.executable, "-c", make_spec], capture_output=True, check=True).stdout
    (tmp_path / "checkout.json").write_bytes(spec_json)
    assert WorkflowSpec.from_json(spec_json).nodes[1].handler == "receipt@1"
    command = [
        sys.executable, "-m", "mayfly", "run", str(tmp_path / "checkout.json"),
        "--journal", f"file://{tmp_path}/journal", "--handlers", str(handlers), "--json",
        "--input", json.dumps({"order_id": "o-1", "amount": 30}),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "o-1 paid 30 (ch-o-1)" in done.stdout

    bad = subprocess.run(
        [*command[:-1], json.dumps({"order_id": "o-2", "amount": "30"})],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert bad.returncode != 0
    assert (
        "input of charge@1 does not match Order: Expected `int`, got `str` at $.amount"
        in bad.stdout + bad.stderr
    )


def test_a_handler_object_registers_again_as_the_typed_function_it_wraps(tmp_path: Path) -> None:
    """Registering a Handler (or a functools.wraps wrapper) in another registry reads the wrapped hints."""
    first = HandlerRegistry()

    @first.handler(version=1)
    def charge(order: Order) -> Charge:
        return Charge(charge_id=order.order_id, amount=order.amount)

    second = HandlerRegistry()
    entry = second.register("charge", 1, charge)
    assert entry.typed is not None and entry.typed.input is not None and entry.typed.input[1] is Order
    result, _ = run(
        tmp_path, second, spec(Node("charge", handler="charge@1")), {"order_id": "o", "amount": 5}
    )
    assert result.outputs["charge"] == {"charge_id": "o", "amount": 5}
