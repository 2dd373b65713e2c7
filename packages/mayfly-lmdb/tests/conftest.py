"""Shared fixtures: a fresh environment URL per test and worker processes killed at its end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lmdb_support import Worker


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    """A directory for a fresh environment (not created yet)."""
    return tmp_path / "env"


@pytest.fixture
def url(env_dir: Path) -> str:
    """The ``lmdb://`` URL of a fresh environment with default options."""
    return f"lmdb://{env_dir}"


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Worker processes started by a test, all killed at its end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()
