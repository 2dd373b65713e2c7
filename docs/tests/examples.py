"""Extract the code examples of the Markdown docs, in page order.

Rules (pinned by test_examples.py):

- Every fenced block whose info string is ``python`` (or ``py``/``python3``)
  is an example and is executed.
- A block opts out only with an HTML comment on the line right before its
  fence that names why: ``<!-- example: skip the server is not part of the docs build -->``.
- ``console``, ``shell``, ``toml`` and every other kind of block are shown, never
  run; that includes ``$ mayfly ...`` command lines.
- Python written as an interactive session (``pycon``, ``ipython``) is refused,
  so an example cannot escape execution by its label.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
PYTHON_INFOS = frozenset({"python", "py", "python3"})
REFUSED_INFOS = frozenset({"pycon", "ipython", "python-console", "pytb"})

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_SKIP = re.compile(r"^\s*<!--\s*example:\s*skip\b(?P<reason>.*?)-->\s*$")
_MARKER = re.compile(r"<!--\s*example:")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its kind, its source and its opt-out reason, if any."""

    page: Path
    line: int  # 1-based line of the first source line
    info: str
    source: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        """``docs/page.md:LINE`` for messages."""
        return f"{self.page.relative_to(DOCS.parent).as_posix()}:{self.line}"


class ExampleMarkupError(ValueError):
    """A docs page uses the example markup wrongly (a skip without a reason, a stray marker)."""


def pages() -> list[Path]:
    """Every Markdown page of the docs, build output excluded, in a stable order."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` in order; raise ExampleMarkupError on misused markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            if _MARKER.search(lines[i]) and not (i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
                raise ExampleMarkupError(
                    f"{page.name}:{i + 1}: an example marker must sit on the line right before a fence"
                )
            i += 1
            continue
        fence = m.group("fence")
        info = (m.group("info").split() or [""])[0].lower()
        skip_reason = None
        if i > 0 and _MARKER.search(lines[i - 1]):
            skip = _SKIP.match(lines[i - 1])
            if skip is None or not skip.group("reason").strip():
                raise ExampleMarkupError(
                    f"{page.name}:{i}: write `<!-- example: skip <why> -->`; a skip must name its reason"
                )
            skip_reason = skip.group("reason").strip()
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        indent = len(m.group("indent"))
        source = "\n".join(line[indent:] for line in body) + "\n"
        out.append(Block(page, start + 1, info, source, skip_reason))
    return out
