"""The backend's docs page: its python examples run, in order, against the non-persistent Redis.

The repository's docs env runs them too; running them here keeps the page
honest whenever this distribution's tests run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "redis.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_python_example_of_the_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's python blocks execute in sequence in one namespace without raising."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = _BLOCK.findall(text)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks:
        line = text[: text.index(block)].count("\n")
        exec(compile("\n" * line + block, str(PAGE), "exec"), namespace)
