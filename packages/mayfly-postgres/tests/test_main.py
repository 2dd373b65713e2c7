"""The operator command: python -m mayfly_postgres migrate|status|drop."""

from __future__ import annotations

import subprocess
import sys

from pgserver import fresh_schema, with_options

from mayfly_postgres import LATEST_VERSION


def command(*arguments: str) -> subprocess.CompletedProcess[str]:
    """Run the operator command in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "mayfly_postgres", *arguments],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_migrate_drop_round_trip(server: str) -> None:
    """status reports 0, migrate applies, status reports the latest, drop needs --yes and removes it."""
    url = with_options(server, schema=fresh_schema())
    assert "at version 0" in command("status", url).stdout
    applied = ", ".join(str(version) for version in range(1, LATEST_VERSION + 1))
    assert f"applied {applied};" in command("migrate", url).stdout
    assert f"at version {LATEST_VERSION}," in command("status", url).stdout
    refused = command("drop", url)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert "dropped schema" in command("drop", url, "--yes").stdout
    assert "at version 0" in command("status", url).stdout


def test_failures_are_one_line_errors(server: str) -> None:
    """An unreachable server exits 1 with a one-line Mayfly error, never a driver traceback."""
    result = command("status", "postgresql://postgres@127.0.0.1:1/test?schema=mayfly")
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
