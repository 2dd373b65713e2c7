"""The seeded simulator's driver (python -m mayfly_contract.sim) on the file journal, and proof it finds real bugs."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

import mayfly.local._frames as frames
from mayfly_contract.sim import SeedContext, main, open_backend, run_seed
from mayfly_contract.sim._storage import FILE_DAMAGE

# The first seed whose storage family damages a frame's length field (the family's first draw).
LENGTH_SEED = next(seed for seed in range(1000) if random.Random(seed).choice(FILE_DAMAGE) == "length_field")


def test_the_header_checksum_is_what_catches_a_damaged_length_field(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = open_backend("file")
    try:
        monkeypatch.setattr(frames, "VERIFY_HEADER_CRC", False)  # the test-only switch: header CRC off
        broken = run_seed(SeedContext(LENGTH_SEED, backend), "storage")
        assert broken.notes[0].startswith("length_field: length field of the last frame")
        assert "corruption_undetected" in {v.kind for v in broken.violations}
        assert any("acknowledged" in v.message for v in broken.violations)

        monkeypatch.setattr(frames, "VERIFY_HEADER_CRC", True)
        fixed = run_seed(SeedContext(LENGTH_SEED, backend), "storage")
        assert fixed.notes == broken.notes  # the same seed: the same workflow, death and damage
        assert fixed.violations == []
        assert fixed.failed_closed == 1  # it failed closed with a typed CorruptionError
    finally:
        backend.close()


def test_a_disk_failing_inside_a_snapshot_write_is_a_typed_error() -> None:
    # Seed 2's storage family fails the disk (EIO after part of a write) inside a snapshot write: the
    # simulator found that the file journal let the raw OSError out there instead of JournalUnavailable.
    assert random.Random(2).choice(FILE_DAMAGE) == "eio"
    backend = open_backend("file")
    try:
        result = run_seed(SeedContext(2, backend), "storage")
        assert result.notes[0].startswith("eio: EIO after ") and "bytes of a write" in result.notes[0]
        assert result.violations == []
        assert result.failed_closed == 1  # the JournalUnavailable, after which a restart finished the run
    finally:
        backend.close()


def test_a_campaign_prints_throughput_then_the_closing_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "file", "--seeds", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "6 seeds, 0 violations"
    assert lines[-2].startswith("file: 6 seeds in ") and " seeds/s); families: " in lines[-2]


def test_a_failing_seed_prints_the_command_that_reproduces_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(frames, "VERIFY_HEADER_CRC", False)
    assert main(["--backend", "file", "--seed", str(LENGTH_SEED), "--seeds", "1", "--family", "storage"]) == 1
    out = capsys.readouterr().out
    command = next(line.split("reproduce: ", 1)[1] for line in out.splitlines() if "reproduce: " in line)
    assert command == f"python -m mayfly_contract.sim --backend file --seed {LENGTH_SEED} --family storage"
    assert out.splitlines()[-1].startswith("1 seeds, ") and not out.splitlines()[-1].endswith(" 0 violations")

    # As printed, in a fresh process (the switch is back on there): the seed runs and now passes.
    args = command.split()[3:]
    rerun = subprocess.run(
        [sys.executable, "-m", "mayfly_contract.sim", *args], check=False, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.stdout.splitlines()[-1] == "1 seeds, 0 violations"


def test_every_family_runs_on_the_file_journal() -> None:
    backend = open_backend("file")
    try:
        for family in ("crash", "storage", "lease"):
            result = run_seed(SeedContext(3, backend), family)
            assert result.family == family and result.violations == [], result
    finally:
        backend.close()


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--backend", "memory", "--seeds", "1", "--family", "storage"])
    assert exit_info.value.code == 2
    assert "no family 'storage' runs on memory" in capsys.readouterr().err
