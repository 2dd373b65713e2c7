#!/usr/bin/env python3
"""Prove a tox env holds one distribution alone: required modules import, forbidden ones do not exist.

Each tox env installs one Mayfly distribution and only what it declares. Run
this first in the env, naming the drivers of every *other* backend::

    python policy/check_isolation.py --require mayfly_lmdb --forbid redis psycopg

A forbidden module is looked up without importing it; the error names the
distribution that installed it, so the leaking dependency is easy to find.
The modules of every benchmark comparator in the policy
(runtime-dependency-policy.toml, ``[[comparator]]``: DBOS) are always
forbidden too, whatever ``--forbid`` names: a comparator lives in its own nox
session's venv and no Mayfly env may be able to import it.
Exit status: 0 isolated, 1 not isolated, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

POLICY = Path(__file__).resolve().parent / "runtime-dependency-policy.toml"


def comparator_modules(policy: Path = POLICY) -> list[str]:
    """The top-level modules of every ``[[comparator]]`` (read from its ``[[banned]]`` entry)."""
    data = tomllib.loads(policy.read_text(encoding="utf-8"))
    names = {str(entry["name"]) for entry in data.get("comparator", [])}
    return sorted(
        str(m) for entry in data.get("banned", []) if entry["name"] in names for m in entry["modules"]
    )


def _providers(module: str) -> str:
    """Name the installed distributions that provide top-level ``module``."""
    dists = importlib.metadata.packages_distributions().get(module, [])
    return ", ".join(sorted(set(dists))) or "no installed distribution (on sys.path directly)"


def check(required: Sequence[str], forbidden: Sequence[str]) -> list[str]:
    """Return one problem line per required module that fails to import or forbidden module that exists.

    The comparators' modules are forbidden in addition to ``forbidden``.
    """
    problems = []
    for name in required:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure means the env cannot run the distribution alone
            problems.append(f"required module {name} does not import: {type(exc).__name__}: {exc}")
    for name in [*forbidden, *(m for m in comparator_modules() if m not in forbidden)]:
        if "." in name:
            problems.append(f"--forbid takes top-level modules; {name!r} is dotted")
        elif importlib.util.find_spec(name) is not None:
            problems.append(
                f"forbidden module {name} is importable (installed by {_providers(name)}); "
                "this env must not install another backend's driver"
            )
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="check_isolation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--require", nargs="*", default=[], metavar="MODULE", help="modules that must import")
    parser.add_argument(
        "--forbid", nargs="+", required=True, metavar="MODULE", help="top-level modules that must not exist"
    )
    args = parser.parse_args(argv)
    problems = check(args.require, args.forbid)
    for line in problems:
        sys.stderr.write(f"isolation: {line}\n")
    if problems:
        return 1
    required = ", ".join(args.require) or "nothing"
    forbidden = [*args.forbid, *(f"{m} (comparator)" for m in comparator_modules() if m not in args.forbid)]
    sys.stdout.write(
        f"isolation ok: imports {required}; {', '.join(forbidden)} not importable "
        f"(Python {sys.version.split()[0]}, {sys.prefix})\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
