"""Typed handlers: a function's type hints, read once at registration, decode its inputs and check its output.

A handler written ``def charge(order: Order, *, reserve: Stock) -> Charge`` is
adapted here into the request-style function the runtime calls:

- its one positional parameter receives the node's input (the run input
  object overlaid with the node's own ``input`` object, as a child call
  sees it), decoded into the declared type;
- each keyword-only parameter receives the output of the upstream node of
  that name (``reserve``, or ``reserve-stock`` for ``reserve_stock``),
  decoded into its declared type; one with a default may be absent;
- a parameter annotated :class:`~mayfly.runtime.request.HandlerRequest`
  receives the request itself (attempt ids, idempotency key, cancellation);
- the return value is encoded to JSON and checked against the declared
  return type before it becomes ``Succeeded(output=...)``. An outcome
  (``RetryableFailure(...)``) returned instead passes through when the
  annotation names outcome types; a ``Succeeded`` output is checked too.

Decoding and checking use msgspec's JSON rules (Structs, dataclasses,
TypedDicts, unions, datetimes...). A value that does not match is a
``PermanentFailure`` whose reason names the value, the type and the place
(``input of charge@1 does not match Order: Expected `int`, got `str` at
$.amount``), never a silent pass: retrying the same data cannot fix it.
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, Final, final

import msgspec
import msgspec.inspect

from mayfly.model.errors import one_line
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import BaseOutcome, PermanentFailure, Succeeded
from mayfly.runtime.request import HandlerRequest
from mayfly.runtime.signals import WaitForSignal

__all__ = ["TypedSignature", "Upstream", "typed_signature"]

_JSON = msgspec.json.Encoder()
_RESULT_TYPES = (BaseOutcome, WaitForSignal)
_NO_DEFAULT: Final[Any] = inspect.Parameter.empty
_MAX_PROBLEM = 1_000
_UNTYPED: Final = (HandlerRequest, Any, object)
"""Annotations a request-style handler's request parameter (and return) may carry."""


@final
class Upstream:
    """A keyword-only parameter fed by the output of the upstream node ``node_id``."""

    __slots__ = ("decoder", "default", "node_id", "param", "type")

    def __init__(self, param: str, annotation: Any, default: Any, decoder: msgspec.json.Decoder[Any]) -> None:
        self.param = param
        self.node_id = param
        self.type = annotation
        self.default = default
        self.decoder = decoder

    @property
    def required(self) -> bool:
        """Whether the node must be upstream (the parameter has no default)."""
        return self.default is _NO_DEFAULT

    def node_ids(self) -> tuple[str, ...]:
        """The node ids this parameter may name: its own name, then with ``_`` written ``-``."""
        dashed = self.param.replace("_", "-")
        return (self.param,) if dashed == self.param else (self.param, dashed)


@final
class TypedSignature:
    """How a typed handler is called and how its result is checked, derived from its type hints."""

    __slots__ = ("input", "input_index", "output", "output_decoder", "request", "upstream")

    def __init__(
        self,
        *,
        request: tuple[tuple[str, bool], ...],
        input: tuple[str, Any, msgspec.json.Decoder[Any]] | None,
        input_index: int,
        upstream: tuple[Upstream, ...],
        output: Any,
        output_decoder: msgspec.json.Decoder[Any] | None,
    ) -> None:
        self.request = request
        """(name, positional) of each parameter receiving the request."""
        self.input = input
        """(name, type, decoder) of the positional parameter receiving the node's input."""
        self.input_index = input_index
        """How many request parameters precede the input one among the positional parameters."""
        self.upstream = upstream
        self.output = output
        """The declared output type (``Any`` when undeclared), or ``None`` when only outcomes are declared."""
        self.output_decoder = output_decoder

    def adapt(self, ref: str, fn: Callable[..., Any]) -> Callable[[HandlerRequest], Any]:
        """The request-style function the runtime calls: decode, call ``fn``, check what it returned."""

        def typed_handler(request: HandlerRequest) -> Any:
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
            for name, positional in self.request:
                if positional:
                    args.append(request)
                else:
                    kwargs[name] = request
            if self.input is not None:
                _, annotation, decoder = self.input
                value, failure = _decode(
                    decoder, _JSON.encode(_node_input(request)), f"input of {ref}", annotation
                )
                if failure is not None:
                    return failure
                args.insert(self.input_index, value)
            for upstream in self.upstream:
                found = _upstream_output(request, upstream)
                if found is None:
                    if upstream.required:
                        return PermanentFailure(
                            reason=f"{ref} reads the output of node {upstream.node_id!r} (parameter "
                            f"`{upstream.param}`), which is not a succeeded prerequisite of node "
                            f"{request.node_id!r}; add it to the node's depends_on (after=)"
                        )
                    continue
                node_id, output = found
                value, failure = _decode(
                    upstream.decoder,
                    _JSON.encode(output),
                    f"output of node {node_id!r} read by {ref}",
                    upstream.type,
                )
                if failure is not None:
                    return failure
                kwargs[upstream.param] = value
            return self._checked(ref, fn(*args, **kwargs))

        typed_handler.__qualname__ = f"typed_handler[{ref}]"
        return typed_handler

    def _checked(self, ref: str, result: Any) -> Any:
        if isinstance(result, _RESULT_TYPES):
            if isinstance(result, Succeeded) and self.output_decoder is not None:
                _, failure = _decode(
                    self.output_decoder,
                    _JSON.encode(result.output),
                    f"{ref} returned an output that",
                    self.output,
                )
                return result if failure is None else failure
            return result
        if self.output_decoder is None:
            return result  # only outcomes are declared: the runtime refuses anything else
        try:
            raw = _JSON.encode(result)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            return PermanentFailure(
                reason=_cut(f"{ref} returned {type(result).__name__}, which is not JSON-serializable: {exc}")
            )
        _, failure = _decode(self.output_decoder, raw, f"{ref} returned an output that", self.output)
        if failure is not None:
            return failure
        output: JsonValue = msgspec.json.decode(raw)
        return Succeeded(output=output)


def typed_signature(ref: str, fn: Callable[..., Any]) -> TypedSignature | None:
    """The typed signature of ``fn``, or ``None`` for a request-style handler (``def h(req)``).

    A handler is request-style when it takes one positional parameter that is
    unannotated or annotated ``HandlerRequest`` (or ``Any``), other parameters
    defaulted, and declares no return type other than outcomes (or ``Any``). Anything else is typed;
    a signature that cannot be served raises ``TypeError`` naming the problem.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: nothing to read, called with the request
    params = list(signature.parameters.values())
    try:
        hints = typing.get_type_hints(_hinted(fn), include_extras=True)
    except Exception as exc:  # NameError for a forward reference, or any error its evaluation raises
        if _request_shaped(params, {}) and _raw_request_annotation(params[0]):
            return None  # e.g. ``req: HandlerRequest`` imported under TYPE_CHECKING only
        raise TypeError(
            f"handler {ref}: cannot resolve its type hints ({type(exc).__name__}: {exc}); typed "
            "handlers decode into their annotated types, so define them where the module can see them"
        ) from None
    if _request_shaped(params, hints) and _outcomes_only(hints.get("return", _NO_DEFAULT)):
        return None
    request: list[tuple[str, bool]] = []
    data_input: tuple[str, Any, msgspec.json.Decoder[Any]] | None = None
    input_index = 0
    upstream: list[Upstream] = []
    for param in params:
        annotation = hints.get(param.name, Any)
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"handler {ref}: *args and **kwargs cannot be typed inputs; name each parameter")
        if annotation is HandlerRequest:
            request.append((param.name, param.kind is not param.KEYWORD_ONLY))
        elif param.kind is param.KEYWORD_ONLY:
            upstream.append(
                Upstream(param.name, annotation, param.default, _decoder(ref, param.name, annotation))
            )
        elif data_input is None:
            data_input = (param.name, annotation, _decoder(ref, param.name, annotation))
            input_index = len(request)
        else:
            raise TypeError(
                f"handler {ref}: parameter `{param.name}` is a second positional parameter; a typed "
                "handler takes its input positionally and upstream outputs as keyword-only parameters "
                f"named for their nodes: def {getattr(fn, '__name__', 'handler')}(input: In, *, node_id: Out)"
            )
    output, decoder = _output(ref, hints.get("return", Any))
    return TypedSignature(
        request=tuple(request),
        input=data_input,
        input_index=input_index,
        upstream=tuple(upstream),
        output=output,
        output_decoder=decoder,
    )


# -- reading the signature ---------------------------------------------------------------


def _hinted(fn: Callable[..., Any]) -> Any:
    """What carries ``fn``'s annotations: the function, or a callable object's ``__call__``.

    A wrapper (a :class:`~mayfly.runtime.registry.Handler`, or a decorator
    using ``functools.wraps``) is read through to what it wraps, as
    ``inspect.signature`` reads it.
    """
    fn = inspect.unwrap(fn)
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return fn
    if isinstance(fn, functools.partial):
        return fn.func
    return getattr(type(fn), "__call__", fn)  # noqa: B004  # the annotations live on the class's method


def _request_shaped(params: list[inspect.Parameter], hints: dict[str, Any]) -> bool:
    """One positional parameter, unannotated or ``HandlerRequest``, every other one defaulted."""
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    if hints.get(params[0].name, HandlerRequest) not in _UNTYPED:
        return False
    return all(
        p.default is not _NO_DEFAULT or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[1:]
    )


def _raw_request_annotation(param: inspect.Parameter) -> bool:
    annotation = param.annotation
    if annotation is _NO_DEFAULT or annotation is HandlerRequest:
        return True
    return isinstance(annotation, str) and annotation.rpartition(".")[2] == "HandlerRequest"


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_result_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, _RESULT_TYPES)


def _outcomes_only(annotation: Any) -> bool:
    """No return annotation, or one naming only outcomes and waits."""
    if annotation is _NO_DEFAULT or annotation in _UNTYPED:
        return True
    return all(_is_result_type(m) for m in _members(annotation))


def _output(ref: str, annotation: Any) -> tuple[Any, msgspec.json.Decoder[Any] | None]:
    data = [m for m in _members(annotation) if not _is_result_type(m)]
    if not data:
        return None, None
    declared = data[0] if len(data) == 1 else functools.reduce(operator.or_, data)
    return declared, _decoder(ref, "return", declared)


def _decoder(ref: str, where: str, annotation: Any) -> msgspec.json.Decoder[Any]:
    # Built at registration, so a type msgspec cannot decode fails here, not on a run's first attempt.
    what = "the return type" if where == "return" else f"parameter `{where}`"
    try:
        decoder = msgspec.json.Decoder(annotation)
        custom = _custom_type(msgspec.inspect.type_info(annotation), set())
    except (TypeError, ValueError) as exc:
        raise TypeError(f"handler {ref}: {what} cannot be decoded from JSON: {exc}") from None
    if custom is not None:
        raise TypeError(
            f"handler {ref}: {what} cannot be decoded from JSON: {_type_name(custom)} is not a msgspec "
            "Struct, dataclass, TypedDict or JSON type"
        )
    return decoder


def _custom_type(info: msgspec.inspect.Type, seen: set[type]) -> Any:
    """The first class within ``info`` that msgspec decodes only through a hook it is not given."""
    if isinstance(info, msgspec.inspect.CustomType):
        return None if info.cls is object else info.cls  # msgspec reads `object` as any JSON value
    cls = getattr(info, "cls", None)
    if isinstance(cls, type):
        if cls in seen:
            return None  # a recursive Struct or dataclass, already being looked at
        seen.add(cls)
    for name in info.__struct_fields__:  # the inspect types are Structs themselves
        value = getattr(info, name)
        for part in value if isinstance(value, tuple | list) else (value,):
            inner = part.type if isinstance(part, msgspec.inspect.Field) else part
            if isinstance(inner, msgspec.inspect.Type):
                found = _custom_type(inner, seen)
                if found is not None:
                    return found
    return None


# -- calling -----------------------------------------------------------------------------


def _node_input(request: HandlerRequest) -> JsonValue:
    """The run input object overlaid with the node's own input object (as a child call reads it)."""
    if request.input is None:
        return request.run_input
    if isinstance(request.run_input, dict) and isinstance(request.input, dict):
        return {**request.run_input, **request.input}
    return request.input


def _upstream_output(request: HandlerRequest, upstream: Upstream) -> tuple[str, JsonValue] | None:
    for node_id in upstream.node_ids():
        result = request.dependencies.get(node_id)
        if result is not None and result.succeeded:
            return node_id, result.output
    return None


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM else text[: _MAX_PROBLEM - 16] + " [...truncated]"


def _decode(
    decoder: msgspec.json.Decoder[Any], raw: bytes, what: str, annotation: Any
) -> tuple[Any, PermanentFailure | None]:
    """The decoded value, or a failure whose reason names ``what``, the type and the location."""
    try:
        return decoder.decode(raw), None
    except msgspec.ValidationError as exc:
        # msgspec ends a located message with " - at `$.amount`".
        problem, located, where = one_line(str(exc)).rpartition(" - at `")
        text = f"{problem} at {where.rstrip('`')}" if located else f"{where} at $"
        return None, PermanentFailure(reason=_cut(f"{what} does not match {_type_name(annotation)}: {text}"))
