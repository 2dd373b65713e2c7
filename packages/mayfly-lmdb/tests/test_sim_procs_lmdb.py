"""The simulator's process families on LMDB: worker processes SIGKILLed mid-run, and two workers sharing runs.

One seed each through the campaign driver (``python -m mayfly_contract.sim
--backend lmdb --family sigkill|workers``), on real LMDB files.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mayfly_contract.sim import run_campaign


@pytest.mark.parametrize(("family", "workers"), [("sigkill", 1), ("workers", 2)])
def test_one_seed_of_each_process_family(family: str, workers: int, tmp_path: Path) -> None:
    out = io.StringIO()
    campaign = run_campaign("lmdb", [2], family=family, workers=workers, directory=tmp_path, out=out)
    assert campaign.results[2].family == family
    assert campaign.violations == 0, out.getvalue()
    assert out.getvalue().endswith("1 seeds, 0 violations\n")
