#!/usr/bin/env python3
"""Audit Mayfly's complete dependency graph and its own sources against ADR-0033.

Run from anywhere: ``python3 policy/check_runtime_dependencies.py --all-targets``.

The auditor itself ships in the ``mayfly-contract`` distribution
(``mayfly_contract.audit``), so that a third party can audit its own backend
with the same rules (``python -m mayfly_contract.audit --help``; see
docs/dependency-policy.md). This script loads that module from this checkout
by file path, without importing ``mayfly_contract`` or anything else that is
not the standard library, and runs it on this repository: its policy, its
lock and its sources. Importing this script gives the auditor module itself.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_SOURCE = _ROOT / "contract-tests" / "src" / "mayfly_contract" / "audit.py"


def _load() -> object:
    spec = importlib.util.spec_from_file_location("check_runtime_dependencies", _SOURCE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the auditor from {_SOURCE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_runtime_dependencies"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    # Run on this checkout, and found here: tools (and tests) that locate the
    # policy beside the auditor's file find policy/runtime-dependency-policy.toml.
    module.DEFAULT_ROOT = _ROOT  # type: ignore[attr-defined]
    module.__file__ = __file__
    return module


_auditor = _load()
if __name__ == "__main__":
    sys.exit(_auditor.main())  # type: ignore[attr-defined]  # the auditor's command line
sys.modules[__name__] = _auditor  # type: ignore[assignment]  # `import check_runtime_dependencies` is the auditor
