"""What a handler returns to wait durably for a signal, and how tokens are made."""

from __future__ import annotations

import secrets
from typing import final

from mayfly.model.ids import is_node_id
from mayfly.model.signals import SignalToken

__all__ = ["WaitForSignal", "new_signal_token"]


def new_signal_token() -> SignalToken:
    """A fresh, unguessable token (32 URL-safe characters from the OS's CSPRNG), never starting with ``-``.

    A leading dash would make ``mayfly signal ... --token -abc`` parse as an
    option; redrawing costs under one bit of the 192.
    """
    while True:
        raw = secrets.token_urlsafe(24)
        if not raw.startswith("-"):
            return SignalToken(raw)


@final
class WaitForSignal:
    """Return this from a handler to park its attempt until signal ``name`` arrives.

    Hand ``token`` (its :meth:`~SignalToken.reveal`) to whoever may answer —
    only its digest is recorded. When a matching signal is accepted, the
    handler is invoked again for the *same* attempt with ``request.signal``
    set to the accepted signal; when ``timeout_ms`` passes first, the attempt
    ends as a retryable timeout and a retry opens a fresh wait.
    """

    __slots__ = ("name", "timeout_ms", "token")

    def __init__(self, name: str, token: SignalToken, *, timeout_ms: int | None = None) -> None:
        if not is_node_id(name):
            raise ValueError(f"invalid signal name {name!r}: use the node-id grammar, e.g. 'approval'")
        if not isinstance(token, SignalToken):
            raise TypeError("token must be a SignalToken (see mayfly.runtime.new_signal_token)")
        if timeout_ms is not None and timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        self.name = name
        self.token = token
        self.timeout_ms = timeout_ms

    def __repr__(self) -> str:
        return f"WaitForSignal({self.name!r}, token=<redacted>, timeout_ms={self.timeout_ms})"
