"""Type checkers see the typed handler API: mypy --strict accepts its use and reports its misuse where it is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]  # the workspace root, whose pyproject configures mypy
_EXPECTED = re.compile(r"#\s*E:\s*(?P<codes>[a-z-]+(?:\s+[a-z-]+)*)\s*$")
_REPORTED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def mypy(path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "mypy", "--strict", "--show-error-codes", "--no-error-summary",
        "--no-pretty", "--cache-dir", str(cache), str(path),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)


def test_the_typed_api_type_checks_and_reveals_the_declared_types(tmp_path: Path) -> None:
    """Handlers keep their signatures as Handler[[In...], Out]; Flow takes them and node handles."""
    done = mypy(HERE / "typed_api.py", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_misuses_are_reported_on_their_lines_with_their_codes(tmp_path: Path) -> None:
    """A wrong input type, a misspelled node handle, an unregistered function, a nameless unversioned decorator.

    Also a handler, or an unknown mode, given to Flow.call.
    """
    source = HERE / "typed_api_errors.py"
    expected = {
        (number, code)
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1)
        if (m := _EXPECTED.search(line))
        for code in m.group("codes").split()
    }
    done = mypy(source, tmp_path)
    reported = {
        (int(m.group("line")), m.group("code")) for m in map(_REPORTED.match, done.stdout.splitlines()) if m
    }
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(expected) == 10
    assert reported == expected, done.stdout


@pytest.mark.parametrize("name", ["typed_api.py", "typed_api_errors.py"])
def test_the_examples_are_not_collected_as_tests(name: str) -> None:
    """The checked files are plain modules; only test_typing.py runs them, through mypy."""
    assert not name.startswith("test_")
    assert (HERE / name).is_file()
