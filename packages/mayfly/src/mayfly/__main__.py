"""``python -m mayfly``: the same as the ``mayfly`` command."""

from mayfly.cli import entry_point

entry_point()
