"""The isolation check that each tox env runs before its tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import check_isolation
import pytest

SCRIPT = Path(check_isolation.__file__).resolve()


def test_isolated_env_passes() -> None:
    """A module that imports and a module that does not exist anywhere give no problem."""
    assert check_isolation.check(["json"], ["mayfly_no_such_driver"]) == []


def test_importable_forbidden_module_names_its_distribution() -> None:
    """A forbidden module that is installed is reported with the distribution that installed it."""
    problems = check_isolation.check([], ["pytest"])
    assert len(problems) == 1
    assert "forbidden module pytest is importable (installed by pytest)" in problems[0]


def test_required_module_that_does_not_import_is_reported() -> None:
    """A required module that fails to import is reported with the import error."""
    problems = check_isolation.check(["mayfly_no_such_backend"], [])
    assert problems == [
        "required module mayfly_no_such_backend does not import: "
        "ModuleNotFoundError: No module named 'mayfly_no_such_backend'"
    ]


def test_dotted_forbidden_name_is_rejected() -> None:
    """Only top-level modules can be forbidden, so a dotted name is a problem, not a silent pass."""
    assert check_isolation.check([], ["redis.asyncio"]) == [
        "--forbid takes top-level modules; 'redis.asyncio' is dotted"
    ]


def test_command_line_exit_status() -> None:
    """The script exits 0 when isolated and 1 when a forbidden module is importable."""
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), "--require", "json", "--forbid", "mayfly_no_such_driver"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(
        "isolation ok: imports json; mayfly_no_such_driver, dbos (comparator) not importable"
    )
    leaked = subprocess.run(
        [sys.executable, str(SCRIPT), "--forbid", "pytest"], capture_output=True, text=True, check=False
    )
    assert leaked.returncode == 1
    assert "isolation: forbidden module pytest is importable" in leaked.stderr


def test_comparator_modules_are_read_from_the_policy() -> None:
    """The benchmark comparators' modules come from the policy's [[comparator]] and [[banned]] entries."""
    assert check_isolation.comparator_modules() == ["dbos"]


def test_an_importable_comparator_fails_even_when_not_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparator's module is forbidden in every env, whatever --forbid names."""
    monkeypatch.setattr(check_isolation, "comparator_modules", lambda: ["pytest"])
    problems = check_isolation.check([], ["mayfly_no_such_driver"])
    assert len(problems) == 1
    assert "forbidden module pytest is importable (installed by pytest)" in problems[0]
