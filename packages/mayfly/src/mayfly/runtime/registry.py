"""The handler registry: implementations registered by stable name and contract version.

Workflow data can only *name* a handler; code is registered explicitly by the
application (ADR-0032 "Security and safety"). An implementation declares the
contract version it implements and, optionally, older versions it can still
serve, so an unfinished run pinned to ``review@1`` resumes on a ``review@2``
implementation only when that implementation says it is compatible.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Generic, ParamSpec, TypeVar, final, overload

from mayfly.model.errors import HandlerUnavailable
from mayfly.model.outcomes import NodeOutcome
from mayfly.model.spec import HandlerRef, WorkflowSpec, parse_handler_ref
from mayfly.runtime._typed import TypedSignature, typed_signature

__all__ = ["Handler", "HandlerEntry", "HandlerFunction", "HandlerRegistry"]

HandlerFunction = Callable[[Any], NodeOutcome]
"""A handler: ``handler(request: HandlerRequest) -> NodeOutcome`` (or a wait/child request)."""

P = ParamSpec("P")
R = TypeVar("R")


@final
class HandlerEntry:
    """One registered implementation."""

    __slots__ = ("compatible", "cooperative", "fn", "name", "non_retryable", "typed", "version")

    def __init__(
        self,
        name: str,
        version: int,
        fn: HandlerFunction,
        compatible: frozenset[int],
        cooperative: bool,
        *,
        non_retryable: tuple[type[Exception], ...] = (),
        typed: TypedSignature | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.fn = fn
        self.compatible = compatible
        self.cooperative = cooperative
        self.non_retryable = non_retryable
        """Exception types that fail an attempt permanently instead of being retried."""
        self.typed = typed
        """How a typed handler's inputs are decoded and its output checked; ``None`` for ``def h(req)``."""

    @property
    def ref(self) -> str:
        """``name@version`` of the contract this implements."""
        return f"{self.name}@{self.version}"

    def __repr__(self) -> str:
        return f"<HandlerEntry {self.ref} cooperative={self.cooperative}>"


@final
class Handler(Generic[P, R]):
    """A registered handler function: still callable as written, and named ``name@version`` in specs.

    :meth:`HandlerRegistry.handler` returns one, so a specification built
    with :class:`mayfly.Flow` can reference the handler object itself;
    ``str(handler)`` is the ``name@version`` the serialized spec holds.
    """

    def __init__(self, fn: Callable[P, R], entry: HandlerEntry) -> None:
        self.fn = fn
        self.entry = entry
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        """The stable handler name."""
        return self.entry.name

    @property
    def version(self) -> int:
        """The contract version this implementation registered as."""
        return self.entry.version

    @property
    def ref(self) -> str:
        """``name@version``, as a specification names it."""
        return self.entry.ref

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __str__(self) -> str:
        return self.entry.ref

    def __repr__(self) -> str:
        return f"<Handler {self.entry.ref}>"


class HandlerRegistry:
    """Maps ``name@version`` to handler implementations; duplicates are errors, never last-wins.

    Handlers run through the substrate's ``offload`` boundary by default, so
    a blocking handler cannot freeze timers, deadlines or cancellation. A
    handler written against substrate primitives (``mayfly.substrate.sleep``...)
    may declare ``cooperative=True`` to run directly on a hub greenlet.

    A handler is request-style (``def h(req) -> NodeOutcome``) or typed
    (``def charge(order: Order, *, reserve: Stock) -> Charge``): a typed
    handler's input and upstream outputs are decoded into its annotated
    types and its return value checked against its return type, each
    mismatch a ``PermanentFailure`` naming where (:mod:`mayfly.runtime._typed`).

    An exception a handler raises is a ``RetryableFailure`` by default, as in
    Temporal: the retry policy decides. ``non_retryable=(KeyError, ...)``
    names the exception types (and their subclasses) that are bugs or
    permanent conditions instead; raising one, or :class:`mayfly.NonRetryable`,
    records a ``PermanentFailure`` whose reason names the type.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], HandlerEntry] = {}
        self._serves: dict[tuple[str, int], HandlerEntry] = {}

    def register(
        self,
        name: str,
        version: int,
        fn: Callable[..., Any],
        *,
        compatible_with: Iterable[int] = (),
        cooperative: bool = False,
        non_retryable: Iterable[type[Exception]] = (),
    ) -> HandlerEntry:
        """Register ``fn`` as contract ``name@version`` (and the older versions it is compatible with).

        ``fn`` is request-style (``fn(request) -> outcome``) or typed, its type
        hints read here: a typed signature msgspec cannot serve raises
        ``TypeError`` now, not when a run first reaches the node.

        ``non_retryable`` lists exception types that fail an attempt
        permanently: they are code, not data, so they belong here with the
        handler that raises them rather than in the serialized spec.
        """
        parse_handler_ref(f"{name}@{version}")  # same grammar as specifications
        if not callable(fn):
            # Refused here, not when a run first reaches the node and records a failure for it.
            raise TypeError(f"handler {name}@{version} must be callable, got {type(fn).__name__}")
        permanent = tuple(non_retryable)
        for kind in permanent:
            # KeyboardInterrupt and SystemExit stop the process, never only the attempt.
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                raise TypeError(
                    f"handler {name}@{version}: non_retryable must list Exception subclasses, got {kind!r}"
                )
        versions = frozenset({version, *compatible_with})
        if any(v < 1 or v > version for v in versions):
            raise ValueError(
                f"handler {name}@{version}: compatible versions must be between 1 and {version}, "
                f"got {sorted(versions)}"
            )
        typed = typed_signature(f"{name}@{version}", fn)
        call: HandlerFunction = fn if typed is None else typed.adapt(f"{name}@{version}", fn)
        entry = HandlerEntry(name, version, call, versions, cooperative, non_retryable=permanent, typed=typed)
        for served in versions:
            existing = self._serves.get((name, served))
            if existing is not None:
                raise ValueError(
                    f"handler contract {name}@{served} is already served by {existing.ref}; "
                    "register each contract version once"
                )
        self._entries[(name, version)] = entry
        for served in versions:
            self._serves[(name, served)] = entry
        return entry

    @overload
    def handler(
        self,
        name: str,
        version: int = 1,
        *,
        compatible_with: Iterable[int] = (),
        cooperative: bool = False,
        non_retryable: Iterable[type[Exception]] = (),
    ) -> Callable[[Callable[P, R]], Handler[P, R]]: ...

    @overload
    def handler(
        self,
        *,
        version: int,
        compatible_with: Iterable[int] = (),
        cooperative: bool = False,
        non_retryable: Iterable[type[Exception]] = (),
    ) -> Callable[[Callable[P, R]], Handler[P, R]]: ...

    def handler(
        self,
        name: str | None = None,
        version: int | None = None,
        *,
        compatible_with: Iterable[int] = (),
        cooperative: bool = False,
        non_retryable: Iterable[type[Exception]] = (),
    ) -> Callable[[Callable[P, R]], Handler[P, R]]:
        """Decorator form of :meth:`register`: ``@registry.handler(version=1)`` or ``("review", version=1)``.

        Without a name, the handler is named for the function (``def charge``
        registers ``charge@1``), and the version must then be given. The
        decorated function is returned as a :class:`Handler`: callable as
        before, and a reference a :class:`mayfly.Flow` node can take.
        """
        if name is None and version is None:
            raise TypeError("registry.handler() needs version=: @registry.handler(version=1)")

        def decorate(fn: Callable[P, R]) -> Handler[P, R]:
            named = name if name is not None else getattr(fn, "__name__", "")
            if name is None and parse_handler_ref_or_none(f"{named}@1") is None:
                raise TypeError(
                    f"handler function {named!r} is not a valid handler name ([a-z][a-z0-9_.-]*); "
                    'give one: @registry.handler("name", version=1)'
                )
            entry = self.register(
                named,
                1 if version is None else version,
                fn,
                compatible_with=compatible_with,
                cooperative=cooperative,
                non_retryable=non_retryable,
            )
            return Handler(fn, entry)

        return decorate

    def resolve(self, ref: str | HandlerRef) -> HandlerEntry | None:
        """The implementation serving ``name@version``, or ``None``."""
        parsed = parse_handler_ref(ref) if isinstance(ref, str) else ref
        return self._serves.get((parsed.name, parsed.version))

    def is_available(self, ref: str) -> bool:
        """Whether some registered implementation serves contract ``ref``."""
        try:
            return self.resolve(ref) is not None
        except ValueError:
            return False

    def missing(self, spec: WorkflowSpec) -> list[str]:
        """Handler contracts named by ``spec`` (and its child catalog) that nothing serves."""
        wanted: dict[str, None] = {}
        for node in spec.nodes:
            if node.handler is not None:
                wanted[node.handler] = None
        for child in spec.catalog:
            for node in child.nodes:
                if node.handler is not None:
                    wanted[node.handler] = None
        return [ref for ref in wanted if not self.is_available(ref)]

    def check(self, spec: WorkflowSpec) -> None:
        """Raise :class:`HandlerUnavailable` naming every contract of ``spec`` nothing serves."""
        missing = self.missing(spec)
        if missing:
            raise HandlerUnavailable(
                f"workflow {spec.workflow_id}@{spec.version} needs handler(s) that are not registered: "
                f"{', '.join(missing)}; register them on the HandlerRegistry before executing"
            )

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and self.is_available(ref)


def parse_handler_ref_or_none(value: str) -> HandlerRef | None:
    """``parse_handler_ref(value)``, or ``None`` when ``value`` is not ``name@version``."""
    try:
        return parse_handler_ref(value)
    except ValueError:
        return None
