#!/usr/bin/env python3
"""Run the import-linter contracts of pyproject.toml over the core and every backend, installed or not.

The contracts hold each backend to the backend SPI, so the import graph must
include the backends' sources. Import-linter only parses them (nothing is
imported), so putting each distribution's ``src`` on ``sys.path`` is enough:
the tox ``core`` env can check every backend without installing a backend or
its driver, and stays isolated. Run it from anywhere::

    python policy/check_layers.py

Exit status: import-linter's (0 when every contract is kept).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (
    "packages/mayfly/src",
    "packages/mayfly-lmdb/src",
    "packages/mayfly-redis/src",
    "packages/mayfly-postgres/src",
    "contract-tests/examples/mayfly-example-sqlite/src",
)


def main() -> int:
    """Lint the imports of every distribution's source tree against the root pyproject's contracts."""
    # Packages are found through sys.path when the graph is built, not when import-linter is imported.
    sys.path[:0] = [str(ROOT / source) for source in SOURCES]
    os.chdir(ROOT)  # the cache and the config are the workspace root's
    return lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True)


if __name__ == "__main__":
    sys.exit(main())
