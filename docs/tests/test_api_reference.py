"""The API reference covers every module a backend author imports, with signatures a reader can use."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from mayfly.backend import BackendURL, parse_backend_url
from mayfly.journal import RunPurge, WorkflowJournal

CONF = Path(__file__).resolve().parents[1] / "conf.py"


def _conf() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_conf", CONF)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_backend_author_module_is_documented() -> None:
    """The journal, lease, kit, hookspecs, testing and substrate modules each get a reference section."""
    modules = _conf().API_MODULES
    for name in ("mayfly.journal", "mayfly.lease", "mayfly.backend", "mayfly.hookspecs", "mayfly.testing"):
        assert name in modules
    assert "mayfly.substrate" in modules


def test_protocols_and_unconstructed_classes_show_no_constructor_signature() -> None:
    """A Protocol's ``(*args, **kwargs)`` and BackendURL's private constructor are left out; others stay."""
    hook: Any = _conf()._readable_signature
    for protocol in (WorkflowJournal, RunPurge):
        assert hook(
            None, "class", f"mayfly.journal.{protocol.__name__}", protocol, {}, "(*args, **kwargs)", None
        ) == (
            "",
            None,
        )
    assert hook(None, "class", "mayfly.backend.BackendURL", BackendURL, {}, "(*, url, _raw)", None) == (
        "",
        None,
    )
    assert (
        hook(None, "function", "mayfly.backend.parse_backend_url", parse_backend_url, {}, "(url)", None)
        is None
    )
