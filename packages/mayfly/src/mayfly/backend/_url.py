"""One parser for backend URLs: the location, then the query converted into a backend's options struct.

A backend declares its options as a frozen ``msgspec.Struct`` whose fields
have defaults (``durability: Literal["sync", "nosync"] = "sync"``,
``pool_size: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 8``) and calls
:func:`parse_backend_url`. The parser refuses, with one message shape that
names the URL (password redacted), the problem and the URL shape expected:

* a raw control character anywhere (``urlsplit`` would silently delete CR,
  LF and tab and open another store), a fragment, a wrong scheme;
* for a ``path`` URL, a user, password or port; for a ``server`` URL, a
  malformed port, or no host where one is required;
* a query field without ``=``, an option given twice, an unknown option
  (one message listing the options), and a value that does not convert to
  the field's type or breaks its constraint, located by option name.

Values convert the way msgspec converts strings in lax mode (``"8"`` to
``8``, ``"true"``/``"1"`` to ``True``); booleans also take ``yes``/``no``/
``on``/``off``. A field's ``msgspec.Meta(description=...)`` is what the error
says the value must be; ``Literal`` and enum fields list their values.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar, final
from urllib.parse import SplitResult, unquote_plus, urlsplit, urlunsplit

import msgspec

from mayfly.journal import redact_url
from mayfly.model.errors import InvalidBackendURL

__all__ = ["BackendURL", "parse_backend_url"]

_O = TypeVar("_O", bound=msgspec.Struct)
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_LOCATED: Final = re.compile(r"^(?P<detail>.*?) - at `\$(?:\.(?P<field>[A-Za-z_][A-Za-z0-9_]*))?[^`]*`$")
_BOOLEAN_WORDS: Final = {"yes": "true", "on": "true", "no": "false", "off": "false"}
_TYPE_WORDS: Final = {
    "`bool`": "true or false",
    "`int`": "an integer",
    "`float`": "a number",
    "`str`": "text",
}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BackendURL(Generic[_O]):
    """A parsed backend URL: where the store is, and its options as the backend's struct.

    ``url`` is the URL as given with any password replaced by ``***`` (for
    messages, logs and :attr:`~mayfly.journal.WorkflowJournal.url`).
    ``location`` is the store's path for ``path`` URLs (``file``, ``lmdb``,
    ``sqlite``: the host part, if any, is its first segment), and the URL path
    for ``server`` URLs, whose ``netloc`` is the authority exactly as written
    (password included, for a driver that takes a URL). ``extra`` holds the
    query fields the backend passes through (``passthrough=True``), in order,
    and ``given`` the names of the options the URL set explicitly (the others
    hold their defaults).
    """

    url: str
    scheme: str
    location: str
    options: _O
    given: frozenset[str] = frozenset()
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    netloc: str = field(default="", repr=False)
    extra: tuple[tuple[str, str], ...] = ()
    label: str = "backend"
    shape: str = ""
    _raw: str = field(default="", repr=False)

    def invalid(self, problem: str) -> InvalidBackendURL:
        """The ``InvalidBackendURL`` for a problem found after parsing, worded like the parser's own."""
        return _invalid(self.label, self._raw, problem, self.shape)

    def with_server(self, host: str, port: int) -> str:
        """The URL as given (password kept, for connecting) with its host and port replaced."""
        parts = urlsplit(self._raw)
        user = parts.netloc.rpartition("@")[0]
        shown_host = f"[{host}]" if ":" in host else host
        netloc = f"{user}@{shown_host}:{port}" if user else f"{shown_host}:{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _invalid(label: str, url: str, problem: str, shape: str) -> InvalidBackendURL:
    expected = f"; expected {shape}" if shape else ""
    return InvalidBackendURL(f"invalid {label} URL {redact_url(url)!r}: {problem}{expected}")


def parse_backend_url(
    url: object,
    options: type[_O],
    shape: str,
    *,
    kind: Literal["path", "server"],
    schemes: Sequence[str] | None = None,
    label: str | None = None,
    host_required: bool = True,
    passthrough: bool = False,
    bare_path: bool = False,
    dec_hook: Callable[[type, Any], Any] | None = None,
) -> BackendURL[_O]:
    """Parse ``url`` into its location and ``options``; bad input raises ``InvalidBackendURL``.

    ``shape`` is the URL form every error suggests (``"lmdb:///DIR?durability=sync"``);
    its scheme is the one accepted unless ``schemes`` lists them, and names
    the backend in messages unless ``label`` does (``"PostgreSQL"``).
    ``kind="path"`` URLs name a file or directory and take no user or port;
    ``kind="server"`` URLs name ``[user[:password]@]host[:port]``, the host
    optional unless ``host_required``. With ``passthrough`` every query field
    that is not an option is returned in :attr:`BackendURL.extra` instead of
    refused. ``bare_path`` accepts a plain path without ``scheme://``.
    ``dec_hook`` converts option values of custom types (msgspec's hook).
    """
    schemes = tuple(schemes) if schemes is not None else (shape.partition("://")[0],)
    name = label if label is not None else schemes[0]
    if not isinstance(url, str):
        raise InvalidBackendURL(f"{name} URL must be a string, got {type(url).__name__}")

    def fail(problem: str) -> InvalidBackendURL:
        return _invalid(name, url, problem, shape)

    if not url:
        raise fail("it is empty")
    control = _CONTROL.search(url)
    if control is not None:
        raise fail(
            f"it holds the control character {control.group()!r} at position {control.start()}; "
            "remove it (a URL is never rewritten to drop one)"
        )
    if bare_path and "://" not in url:
        location, _, query = url.partition("?")
        parts = SplitResult(schemes[0], "", location, query, "")
    else:
        try:
            parts = urlsplit(url)
            _ = parts.port  # raises ValueError for a malformed or out-of-range port
        except ValueError as error:
            raise fail(f"malformed host or port ({error})") from None
        if parts.scheme.lower() not in schemes:
            wanted = " or ".join(f"{scheme}://" for scheme in schemes)
            raise fail(f"the scheme must be {wanted}, got {parts.scheme + '://' if parts.scheme else 'none'}")
    if parts.fragment:
        raise fail(f"a fragment (#{parts.fragment}) has no meaning here; remove it")
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = None
    if kind == "path":
        if "@" in parts.netloc or parts.port is not None:
            raise fail("a path URL takes no user, password or port")
        location = parts.path if parts.netloc in ("", "localhost") else parts.netloc + parts.path
        if not location:
            raise fail("it names no path")
    else:
        location = parts.path
        host = parts.hostname or None
        port = parts.port
        if host is None and host_required:
            raise fail("it names no host")
        username = unquote_plus(parts.username) if parts.username else None
        password = unquote_plus(parts.password) if parts.password is not None else None
    values, extra = _query(parts.query, options, passthrough, fail)
    return BackendURL(
        url=redact_url(url),
        scheme=parts.scheme.lower(),
        location=location,
        options=_convert(values, options, dec_hook, fail),
        given=frozenset(values),
        host=host,
        port=port,
        username=username,
        password=password,
        netloc=parts.netloc,
        extra=tuple(extra),
        label=name,
        shape=shape,
        _raw=url,
    )


def _query(
    query: str,
    options: type[msgspec.Struct],
    passthrough: bool,
    fail: Callable[[str], InvalidBackendURL],
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    known = options.__struct_fields__
    values: dict[str, str] = {}
    extra: list[tuple[str, str]] = []
    for item in query.split("&"):
        if not item:
            continue
        if "=" not in item:
            raise fail(f"query field {unquote_plus(item)!r} has no value; write NAME=VALUE")
        raw_name, _, raw_value = item.partition("=")
        name, value = unquote_plus(raw_name), unquote_plus(raw_value)
        if name not in known:
            if passthrough and name:
                extra.append((name, value))
                continue
            listed = ", ".join(known) if known else "none"
            raise fail(f"unknown option {name!r} (the options are: {listed})")
        if name in values:
            raise fail(f"option {name} is given twice")
        values[name] = value
    return values, extra


def _convert(
    values: dict[str, str],
    options: type[_O],
    dec_hook: Callable[[type, Any], Any] | None,
    fail: Callable[[str], InvalidBackendURL],
) -> _O:
    hints = typing.get_type_hints(options, include_extras=True)
    prepared: dict[str, str] = {}
    for name, value in values.items():
        flag = _plain(hints[name]) is bool
        prepared[name] = _BOOLEAN_WORDS.get(value.lower(), value.lower()) if flag else value
    try:
        return msgspec.convert(prepared, options, strict=False, dec_hook=dec_hook)
    except msgspec.ValidationError as error:
        located = _LOCATED.match(str(error))
        where = located.group("field") if located else None
        if located is None or where is None or where not in values:
            raise fail(f"the options do not fit ({error})") from None
        expected = _expectation(hints[where], located.group("detail"))
        raise fail(f"option {where}={values[where]!r} {expected}") from None


def _plain(annotation: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return arguments[0] if len(arguments) == 1 else annotation
    return annotation


def _expectation(annotation: Any, detail: str) -> str:
    """What the value must be: the field's description, its allowed values, or msgspec's constraint."""
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in typing.get_args(annotation)[1:]:
            if isinstance(meta, msgspec.Meta) and meta.description:
                return f"must be {meta.description}"
    plain = _plain(annotation)
    if typing.get_origin(plain) is Literal:
        return "must be one of " + ", ".join(repr(value) for value in typing.get_args(plain))
    if isinstance(plain, type) and issubclass(plain, enum.Enum):
        return "must be one of " + ", ".join(repr(member.value) for member in plain)
    if detail.startswith("Expected "):
        expected = detail.removeprefix("Expected ").split(", got ")[0]
        for name, words in _TYPE_WORDS.items():
            expected = expected.replace(name, words)
        return "must be " + expected.replace("`", "")
    if detail.startswith(("must ", "is ")):
        return detail  # a dec_hook's own wording
    return f"is invalid: {detail}"
