"""A plugin that upcasts ``NodeReady`` v1 too: installed beside mayfly-acme-policy, the key clashes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mayfly.hookspecs import hookimpl

MAYFLY_PLUGIN_API = 1


@hookimpl
def mayfly_event_upcasters() -> Mapping[tuple[str, int], Callable[[Any], Any]]:
    """Another upcaster for ``NodeReady`` v1, which must never silently win or lose."""
    return {("NodeReady", 1): lambda body: {**body, "node_id": body["node"]}}
