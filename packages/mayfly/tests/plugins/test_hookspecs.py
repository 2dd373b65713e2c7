"""Tests of the hook specifications: names, documentation and calling conventions."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mayfly import hookspecs
from mayfly.hookspecs import PLUGIN_API, PROJECT_NAME, BackendDescriptor

HOOKS = [
    "mayfly_journal_backends",
    "mayfly_lease_backends",
    "mayfly_register_handlers",
    "mayfly_validate_spec",
    "mayfly_event_upcasters",
]


@pytest.mark.parametrize("name", HOOKS)
def test_each_hook_is_a_documented_collecting_spec(name: str) -> None:
    """Every hook is a spec of the mayfly project with a docstring, and collects all results."""
    function = getattr(hookspecs, name)
    options = getattr(function, f"{PROJECT_NAME}_spec")
    assert options["firstresult"] is False
    doc = inspect.getdoc(function) or ""
    assert len(doc.split()) >= 20


def test_plugin_api_and_project_name() -> None:
    """Plugins declare API 1 of the "mayfly" entry-point group."""
    assert (PROJECT_NAME, PLUGIN_API) == ("mayfly", 1)


def test_backend_descriptor_is_frozen() -> None:
    """A backend descriptor is an immutable value."""
    descriptor = BackendDescriptor(("x",), "dist", str)
    with pytest.raises(dataclasses.FrozenInstanceError):
        descriptor.distribution = "other"  # type: ignore[misc]
    assert descriptor.describe is None
