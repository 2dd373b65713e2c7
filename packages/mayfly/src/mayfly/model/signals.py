"""Durable external waits: opaque signal tokens and the facts about signals (ADR-0032 Story 1.8).

A raw :class:`SignalToken` is a secret handed to an external actor (an
approver, a webhook). It is never serialized and redacts itself everywhere it
could leak — ``repr``, ``str``, formatting, pickling, msgspec encoding; only
its canonical SHA-256 digest enters events and state.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Any, NoReturn, final

import msgspec

from mayfly.model.errors import InvalidSignalToken
from mayfly.model.json import JsonValue

__all__ = [
    "AcceptedSignal",
    "ConsumedSignal",
    "SignalRejection",
    "SignalToken",
    "SignalWait",
    "is_token_digest",
]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MIN_TOKEN = 16
_MAX_TOKEN = 1024


def is_token_digest(value: object) -> bool:
    """Whether ``value`` is a canonical token digest (``sha256:`` and 64 lowercase hex digits)."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


@final
class SignalToken:
    """An opaque signal token; compare it only through :attr:`digest`.

    Tokens are 16 to 1024 printable ASCII characters without spaces; anything
    else raises :class:`~mayfly.model.errors.InvalidSignalToken`. Use
    ``SignalToken.generate()`` (in the runtime layer) or any secret of your own.
    """

    __slots__ = ("__secret",)

    def __init__(self, secret: str) -> None:
        if not isinstance(secret, str) or not (_MIN_TOKEN <= len(secret) <= _MAX_TOKEN):
            raise InvalidSignalToken(f"a signal token must be {_MIN_TOKEN}..{_MAX_TOKEN} characters")
        if not (secret.isascii() and secret.isprintable()) or " " in secret:
            raise InvalidSignalToken("a signal token must be printable ASCII without spaces")
        self.__secret = secret

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the token's UTF-8 bytes: the only form that is ever stored."""
        return "sha256:" + hashlib.sha256(self.__secret.encode()).hexdigest()

    def reveal(self) -> str:
        """The raw secret, for handing to the external actor (never log or store it)."""
        return self.__secret

    def __repr__(self) -> str:
        return "SignalToken(<redacted>)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SignalToken) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __reduce__(self) -> NoReturn:
        raise TypeError("signal tokens cannot be pickled or serialized; store SignalToken.digest")

    def __getstate__(self) -> NoReturn:
        raise TypeError("signal tokens cannot be pickled or serialized; store SignalToken.digest")

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: object) -> Any:
        return self


class SignalRejection(enum.Enum):
    """Why a delivered signal was recorded as rejected (it consumes the signal id)."""

    NOT_WAITING = "not_waiting"
    TOKEN_MISMATCH = "token_mismatch"
    NAME_MISMATCH = "name_mismatch"
    EXPIRED = "expired"


class AcceptedSignal(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The signal a waiting attempt accepted; the resumed handler receives it."""

    signal_id: str
    name: str
    decision: JsonValue = None


class SignalWait(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An open durable wait: the signal name, the token digest and the absolute deadline, if any."""

    name: str
    token_sha256: str
    deadline: int | None = None


class ConsumedSignal(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A signal id the run has consumed, and whether it was accepted (else rejected, with why)."""

    signal_id: str
    node_id: str
    accepted: bool
    rejection: SignalRejection | None = None
