"""Report every documentation example that opted out of execution, with its reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from examples import PYTHON_INFOS, blocks, pages  # needs the path above


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """List skipped examples so an opt-out is always visible in the test output."""
    skipped = [b for p in pages() for b in blocks(p) if b.info in PYTHON_INFOS and b.skip_reason]
    terminalreporter.section("documentation examples not executed")
    if not skipped:
        terminalreporter.write_line("none: every python example in docs/ was executed")
    for block in skipped:
        terminalreporter.write_line(f"{block.where}: {block.skip_reason}")
