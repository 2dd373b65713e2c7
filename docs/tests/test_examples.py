"""Every Python example in docs/**/*.md runs, page by page, in order, in one namespace per page.

Console blocks (including ``$ mayfly ...`` command lines) are shown to readers
and never executed; see examples.py for the full markup rules.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from examples import DOCS, PYTHON_INFOS, REFUSED_INFOS, Block, ExampleMarkupError, blocks, pages


def _run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    """Execute the page's examples; return the ones that ran."""
    monkeypatch.chdir(tmp_path)  # examples that write files (a journal directory) write here
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem}"}
    ran = []
    for block in blocks(page):
        if block.info not in PYTHON_INFOS or block.skip_reason:
            continue
        # Pad so tracebacks point at the Markdown file's own line numbers.
        # dont_inherit: run as a reader's file would, without this module's `from __future__` imports.
        code = compile("\n" * (block.line - 1) + block.source, str(page), "exec", dont_inherit=True)
        exec(code, namespace)  # the docs are our own code, run exactly as a reader would
        ran.append(block)
    return ran


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each page's python blocks execute in sequence without raising."""
    _run(page, tmp_path, monkeypatch)


def test_the_docs_have_executed_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner is not vacuous: the landing page has examples, and they ran."""
    ran = _run(DOCS / "index.md", tmp_path, monkeypatch)
    assert len(ran) >= 2


def test_no_example_hides_behind_an_interactive_label() -> None:
    """No docs block is labelled as an interactive session, which the runner would not execute."""
    refused = [b.where for p in pages() for b in blocks(p) if b.info in REFUSED_INFOS]
    assert refused == []


def test_a_failing_example_points_at_its_markdown_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raising example fails with a traceback naming the Markdown file and line."""
    page = tmp_path / "broken.md"
    page.write_text(
        textwrap.dedent(
            """\
            # Broken

            ```python
            x = 1
            ```

            Text.

            ```python
            assert x == 2, "x is not 2"
            ```
            """
        ),
        encoding="utf-8",
    )
    with pytest.raises(AssertionError, match="x is not 2") as info:
        _run(page, tmp_path, monkeypatch)
    last = info.traceback[-1]
    assert (Path(str(last.path)).name, last.lineno + 1) == ("broken.md", 10)


def test_console_and_skipped_blocks_do_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Console blocks and python blocks with a reasoned skip marker are not executed."""
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ mayfly runs --state waiting\n```\n\n"
        "<!-- example: skip needs a PostgreSQL server -->\n"
        "```python\nraise SystemExit('must not run')\n```\n\n"
        "```python\nok = True\n```\n",
        encoding="utf-8",
    )
    ran = _run(page, tmp_path, monkeypatch)
    assert [b.line for b in ran] == [11]
    assert [b.skip_reason for b in blocks(page) if b.skip_reason] == ["needs a PostgreSQL server"]


def test_skip_without_a_reason_is_refused(tmp_path: Path) -> None:
    """A skip marker that does not say why is a markup error, not a silent opt-out."""
    page = tmp_path / "page.md"
    page.write_text("<!-- example: skip -->\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(ExampleMarkupError, match="a skip must name its reason"):
        blocks(page)


def test_marker_away_from_a_fence_is_refused(tmp_path: Path) -> None:
    """A marker that is not directly above a fence is an error, so it cannot drift off its block."""
    page = tmp_path / "page.md"
    page.write_text("<!-- example: skip stale -->\n\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(ExampleMarkupError, match="right before a fence"):
        blocks(page)
