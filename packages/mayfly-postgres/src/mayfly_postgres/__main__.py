"""Operator commands: ``python -m mayfly_postgres migrate URL`` (and ``status``, ``drop``).

``migrate`` applies pending schema migrations, for deployments whose runtime
role may not run DDL (open the journal with ``?migrate=never`` there).
``status`` prints the applied and expected schema versions. ``drop`` removes
the schema and all its runs; it asks for ``--yes``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg

from mayfly.errors import MayflyError
from mayfly_postgres._pool import unavailable
from mayfly_postgres._schema import LATEST_VERSION, applied_version, drop_schema, migrate
from mayfly_postgres._url import parse_url

__all__ = ["main"]


def _run(command: str, url: str) -> str:
    settings = parse_url(url)
    try:
        with psycopg.Connection.connect(settings.conninfo, autocommit=True) as connection:
            if command == "migrate":
                applied = migrate(connection, settings)
                done = ", ".join(map(str, applied)) if applied else "nothing (already current)"
                return f"{settings.url} schema {settings.schema}: applied {done}; at version {LATEST_VERSION}"
            if command == "status":
                current = applied_version(connection, settings.schema)
                return (
                    f"{settings.url} schema {settings.schema}: at version {current}, "
                    f"this mayfly-postgres needs {LATEST_VERSION}"
                )
            drop_schema(connection, settings)
            return f"{settings.url}: dropped schema {settings.schema}"
    except psycopg.Error as error:
        raise unavailable(settings.url, command, error) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 failed, 2 usage)."""
    parser = argparse.ArgumentParser(prog="python -m mayfly_postgres", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("migrate", "status", "drop"))
    parser.add_argument("url", help="postgresql://USER@HOST:PORT/DB?schema=NAME")
    parser.add_argument("--yes", action="store_true", help="confirm `drop` (deletes every run in the schema)")
    args = parser.parse_args(argv)
    if args.command == "drop" and not args.yes:
        sys.stderr.write("drop deletes the schema and every run in it; repeat with --yes to confirm\n")
        return 2
    try:
        sys.stdout.write(_run(args.command, args.url) + "\n")
    except MayflyError as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
