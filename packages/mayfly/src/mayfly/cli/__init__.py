"""The ``mayfly`` command line (see ``mayfly --help`` and docs/cli.md)."""

from mayfly.cli._app import EXIT, build_parser, entry_point, main

__all__ = ["EXIT", "build_parser", "entry_point", "main"]
