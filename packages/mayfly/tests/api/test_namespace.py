"""The root namespace is a user API: a short list of user-facing names, with errors and ids as modules."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import mayfly
import mayfly.errors
import mayfly.ids
import mayfly.model.errors
import mayfly.model.ids
import mayfly.reducer
from mayfly.model import commands


def test_the_root_exports_at_most_40_user_facing_names() -> None:
    """mayfly.__all__ is short, sorted, and every name in it resolves."""
    assert len(mayfly.__all__) <= 40
    assert mayfly.__all__ == sorted(mayfly.__all__, key=lambda name: (name[0].islower(), name))
    for name in mayfly.__all__:
        assert getattr(mayfly, name) is not None


def test_the_reducer_vocabulary_stays_below_the_root() -> None:
    """Commands, decide/reduce and id helpers are not root exports; they live in their modules."""
    below = {
        "decide",
        "reduce",
        "replay",
        "ensure_valid",
        "validate",
        "parse_run_id",
        "DeterministicIdSource",
    }
    below |= set(commands.__all__)
    assert below.isdisjoint(mayfly.__all__)
    assert "errors" in mayfly.__all__ and "ids" in mayfly.__all__


def test_errors_and_ids_are_public_modules_holding_the_whole_hierarchy_and_grammar() -> None:
    """mayfly.errors and mayfly.ids re-export every error and identity name of the model, unchanged."""
    assert mayfly.errors.__all__ == mayfly.model.errors.__all__
    assert mayfly.ids.__all__ == mayfly.model.ids.__all__
    for module, origin in ((mayfly.errors, mayfly.model.errors), (mayfly.ids, mayfly.model.ids)):
        for name in module.__all__:
            assert getattr(module, name) is getattr(origin, name)
    assert mayfly.MayflyError is mayfly.errors.MayflyError


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("decide", mayfly.reducer),
        ("CreateRun", commands),
        ("RunNotFound", mayfly.errors),
        ("parse_run_id", mayfly.ids),
    ],
)
def test_a_moved_name_still_resolves_with_a_deprecation_naming_its_home(name: str, home: object) -> None:
    """Old code reading a name the root no longer exports gets the same object and a DeprecationWarning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(mayfly, name)
    assert value is getattr(home, name)
    assert [str(w.message) for w in caught] == [
        f"mayfly.{name} moved to {home.__name__}.{name}; import it from there"  # type: ignore[attr-defined]
    ]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        mayfly.no_such_name  # noqa: B018  # the attribute access is what is tested


def test_importing_the_runtime_alone_opens_a_url(tmp_path: object) -> None:
    """`from mayfly.runtime import WorkflowRuntime` opens a journal URL in a fresh process on its own."""
    probe = (
        "from mayfly.runtime import WorkflowRuntime\n"
        f"runtime = WorkflowRuntime('file://{tmp_path}/journal')\n"
        "print(type(runtime.journal).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "LocalWorkflowJournal", done.stderr
