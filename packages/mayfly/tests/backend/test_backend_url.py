"""parse_backend_url: one parser, options converted into the backend's struct, one wording for every refusal."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec
import pytest

from mayfly.backend import parse_backend_url
from mayfly.errors import InvalidBackendURL

SHAPE = "demo:///DIR?mode=fast&workers=4"


class Colour(enum.StrEnum):
    """An enum option."""

    RED = "red"
    BLUE = "blue"


class Size(int):
    """A custom option type, converted by the backend's hook."""


class DemoOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Every kind of option a backend declares."""

    mode: Literal["fast", "safe"] = "fast"
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    timeout: Annotated[float, msgspec.Meta(gt=0, description="seconds above 0")] = 1.5
    readonly: bool = False
    colour: Colour = Colour.RED
    size: Size | None = None


def _size(kind: type, value: Any) -> Any:
    if kind is not Size:
        raise NotImplementedError(kind)
    if not str(value).endswith("k"):
        raise ValueError("is not a size like 4k")
    return Size(int(str(value)[:-1]) * 1024)


def parse(url: object, **kwargs: Any) -> Any:
    """Parse a demo URL the way a path backend would."""
    return parse_backend_url(url, DemoOptions, SHAPE, kind="path", dec_hook=_size, **kwargs)


def test_options_convert_into_the_declared_struct() -> None:
    """Query values become the struct's types: literals, bounded ints, floats, booleans, enums, custom types."""
    parsed = parse("demo:///srv/x?mode=safe&workers=8&timeout=0.25&readonly=yes&colour=blue&size=4k")
    assert parsed.options == DemoOptions(
        mode="safe", workers=8, timeout=0.25, readonly=True, colour=Colour.BLUE, size=Size(4096)
    )
    assert parsed.given == {"mode", "workers", "timeout", "readonly", "colour", "size"}
    assert (parsed.scheme, parsed.location) == ("demo", "/srv/x")
    defaults = parse("demo://localhost/srv/x")
    assert defaults.options == DemoOptions() and defaults.given == frozenset()
    assert defaults.location == "/srv/x"
    assert parse("demo://relative/dir").location == "relative/dir"
    for word, value in (("true", True), ("1", True), ("ON", True), ("no", False), ("0", False)):
        assert parse(f"demo:///x?readonly={word}").options.readonly is value


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("demo:///x?mode=slow", "option mode='slow' must be one of 'fast', 'safe'"),
        ("demo:///x?workers=0", "option workers='0' must be an integer >= 1"),
        ("demo:///x?workers=many", "option workers='many' must be an integer"),
        ("demo:///x?timeout=0", "option timeout='0' must be seconds above 0"),
        ("demo:///x?readonly=maybe", "option readonly='maybe' must be true or false"),
        ("demo:///x?colour=green", "option colour='green' must be one of 'red', 'blue'"),
        ("demo:///x?size=4", "option size='4' is not a size like 4k"),
        ("demo:///x?mode=fast&mode=safe", "option mode is given twice"),
        ("demo:///x?mode", "query field 'mode' has no value; write NAME=VALUE"),
        (
            "demo:///x?speed=9",
            "unknown option 'speed' (the options are: mode, workers, timeout, readonly, colour, size)",
        ),
        ("demo:///x#top", "a fragment (#top) has no meaning here"),
        ("other:///x", "the scheme must be demo://, got other://"),
        ("demo://", "it names no path"),
        ("demo://user@host/x", "a path URL takes no user, password or port"),
        ("demo://host:9/x", "a path URL takes no user, password or port"),
        ("", "it is empty"),
    ],
)
def test_every_refusal_names_the_url_the_problem_and_the_shape(url: str, problem: str) -> None:
    """Each bad URL raises one InvalidBackendURL: invalid <label> URL '<url>': <problem>; expected <shape>."""
    with pytest.raises(InvalidBackendURL) as caught:
        parse(url)
    message = str(caught.value)
    assert message.startswith(f"invalid demo URL {url!r}: {problem}"), message
    assert message.endswith(f"; expected {SHAPE}")


@pytest.mark.parametrize(
    "url", ["demo:///x\n", "demo:///x?mode=fast\r\nFLUSHALL", "demo:///a\tb", "demo:///\x00"]
)
def test_a_raw_control_character_is_refused_where_it_stands(url: str) -> None:
    """A control character is refused with its position; the message holds no raw control character."""
    with pytest.raises(
        InvalidBackendURL, match=r"holds the control character '\\.+' at position \d+"
    ) as caught:
        parse(url)
    assert not any(ord(character) < 0x20 for character in str(caught.value))


def test_a_non_string_url_is_refused() -> None:
    """A URL that is not a str is InvalidBackendURL, not a TypeError."""
    with pytest.raises(InvalidBackendURL, match="demo URL must be a string, got bytes"):
        parse(b"demo:///x")


def test_server_urls_give_credentials_host_port_and_keep_the_password_out_of_sight() -> None:
    """A server URL yields user, password, host and port; messages and repr show the password redacted."""
    parsed = parse_backend_url(
        "demo://app:s%40cret@db.internal:7000/4?mode=safe", DemoOptions, SHAPE, kind="server"
    )
    assert (parsed.username, parsed.password, parsed.host, parsed.port) == (
        "app",
        "s@cret",
        "db.internal",
        7000,
    )
    assert parsed.location == "/4"
    assert "cret" not in parsed.url and "cret" not in repr(parsed)
    assert parsed.with_server("127.0.0.1", 9) == "demo://app:s%40cret@127.0.0.1:9/4?mode=safe"
    with pytest.raises(InvalidBackendURL) as caught:
        parse_backend_url("demo://app:s3cret@db/4?bogus=1", DemoOptions, SHAPE, kind="server")
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    with pytest.raises(InvalidBackendURL, match="it names no host"):
        parse_backend_url("demo:///4", DemoOptions, SHAPE, kind="server")
    assert parse_backend_url("demo:///4", DemoOptions, SHAPE, kind="server", host_required=False).host is None
    with pytest.raises(InvalidBackendURL, match=r"malformed host or port"):
        parse_backend_url("demo://db:99999/4", DemoOptions, SHAPE, kind="server")


def test_passthrough_keeps_unknown_fields_for_the_driver_in_order() -> None:
    """With passthrough, query fields that are not options are returned in order instead of refused."""
    parsed = parse_backend_url(
        "demo://db/4?sslmode=require&mode=safe&application_name=a%20b",
        DemoOptions,
        SHAPE,
        kind="server",
        passthrough=True,
    )
    assert parsed.options.mode == "safe"
    assert parsed.extra == (("sslmode", "require"), ("application_name", "a b"))


def test_bare_paths_and_several_schemes_and_labels() -> None:
    """bare_path takes a plain path; schemes lists every accepted scheme; label names the backend."""
    assert parse("/srv/x?mode=safe", bare_path=True).location == "/srv/x"
    both = parse_backend_url("demos:///x", DemoOptions, SHAPE, kind="path", schemes=("demo", "demos"))
    assert both.scheme == "demos"
    with pytest.raises(
        InvalidBackendURL, match=r"^invalid Demo store URL 'x://y': the scheme must be demo:// or demos://"
    ):
        parse_backend_url(
            "x://y", DemoOptions, SHAPE, kind="path", schemes=("demo", "demos"), label="Demo store"
        )


def test_a_backend_s_own_checks_are_worded_like_the_parser_s() -> None:
    """BackendURL.invalid() builds the same message shape for problems found after parsing."""
    parsed = parse("demo:///x?workers=2")
    error = parsed.invalid("workers=2 needs mode=safe")
    assert (
        str(error) == f"invalid demo URL 'demo:///x?workers=2': workers=2 needs mode=safe; expected {SHAPE}"
    )
