"""The backend's docs page: every python example on it runs, in order, with mayfly-lmdb installed.

The docs env of the repository installs only the core, so the page marks its
examples skipped there; this module is what executes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "lmdb.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_python_example_of_the_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's python blocks execute in sequence in one namespace without raising."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = _BLOCK.findall(text)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks:
        line = text[: text.index(block)].count("\n")
        exec(compile("\n" * line + block, str(PAGE), "exec"), namespace)
