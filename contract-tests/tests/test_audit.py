"""The dependency audit as a third party runs it: on its own wheel, project or requirements, outside our repository.

Every run here is ``mayfly-audit ...`` in a subprocess whose working
directory is a temporary one, auditing distributions built on the spot, so
nothing of this repository (its lock, its policy file, its sources) is in
reach except through the installed ``mayfly-contract``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from mayfly_contract import audit

REPOSITORY = Path(__file__).resolve().parents[2]


def mayfly_audit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``mayfly-audit`` command from ``cwd``."""
    # Installed beside the interpreter running the tests (the environment's bin directory).
    command = shutil.which("mayfly-audit", path=str(Path(sys.executable).parent)) or shutil.which(
        "mayfly-audit"
    )
    assert command is not None, "mayfly-contract installs the mayfly-audit command"
    return subprocess.run([command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def wheel(directory: Path, name: str, requires: list[str], modules: dict[str, str]) -> Path:
    """Write a minimal wheel: a METADATA naming ``requires`` and the given modules."""
    path = directory / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    extras = sorted({r.split('extra == "', 1)[1].split('"', 1)[0] for r in requires if "extra ==" in r})
    metadata += [f"Provides-Extra: {extra}" for extra in extras]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{info}/METADATA", "\n".join(metadata) + "\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        for module, source in modules.items():
            archive.writestr(module, textwrap.dedent(source))
    return path


def policy_banning(directory: Path, *names: str) -> Path:
    """A copy of the shipped policy that also bans ``names`` (installed, harmless distributions)."""
    text = audit.PACKAGED_POLICY.read_text(encoding="utf-8")
    extra = "".join(
        f'\n[[banned]]\nname = "{name}"\nmodules = []\nwhy = "banned by this test"\n' for name in names
    )
    path = directory / "policy.toml"
    path.write_text(text.replace("# Examined and tolerated", extra + "\n# Examined and tolerated", 1))
    return path


def test_a_clean_wheel_passes_offline(tmp_path: Path) -> None:
    """A backend wheel whose graph and source are clean exits 0 and says what it covered."""
    backend = wheel(
        tmp_path,
        "mayfly-mystore",
        ["mayfly-runtime>=0.1", "msgspec>=0.18", 'pytest>=8; extra == "test"'],
        {"mayfly_mystore/__init__.py": "import socket\n\nMAYFLY_PLUGIN_API = 1\n"},
    )
    completed = mayfly_audit(tmp_path, backend.name)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "runtime-dependency audit clean: 2 roots x 1 targets" in completed.stdout
    assert "1 source files scanned, 0 source finding(s)" in completed.stdout
    assert "mayfly-runtime is Mayfly's own distribution" in completed.stdout


def test_a_wheel_that_runs_its_own_loop_or_threads_fails_with_locations(tmp_path: Path) -> None:
    """asyncio, async def and a thread started in shipped code fail, each with file and line."""
    backend = wheel(
        tmp_path,
        "mayfly-loopy",
        ["msgspec"],
        {
            "mayfly_loopy/__init__.py": """\
                import asyncio
                import threading


                async def poll():
                    await asyncio.sleep(1)


                def start():
                    threading.Thread(target=print).start()
                """
        },
    )
    completed = mayfly_audit(tmp_path, str(backend))
    assert completed.returncode == 1, completed.stdout + completed.stderr
    out = completed.stdout
    assert f"SOURCE {backend.name}/mayfly_loopy/__init__.py:1: asyncio: imports asyncio" in out
    assert "mayfly_loopy/__init__.py:5: async: async def poll" in out
    assert "mayfly_loopy/__init__.py:10: thread: threading.Thread(...) outside the substrate" in out


def test_a_path_to_a_banned_distribution_is_printed_hop_by_hop(tmp_path: Path) -> None:
    """A dependency path reaching a banned distribution fails, printed with every hop and its version."""
    policy = policy_banning(tmp_path, "pluggy")
    backend = wheel(tmp_path, "mayfly-deep", ['pytest>=8; extra == "test"'], {"mayfly_deep/__init__.py": ""})
    completed = mayfly_audit(tmp_path, backend.name, "--policy", str(policy))
    assert completed.returncode == 1, completed.stdout + completed.stderr
    forbidden = [line for line in completed.stdout.splitlines() if line.startswith("FORBIDDEN ")]
    assert len(forbidden) == 1
    assert forbidden[0].startswith("FORBIDDEN mayfly-deep 1.0 [extra test] -> pytest ")
    assert " -> pluggy " in forbidden[0]
    assert "pluggy is banned: banned by this test" in completed.stdout


def test_a_requirement_not_installed_fails_closed(tmp_path: Path) -> None:
    """A runtime requirement the environment lacks cannot be audited offline, so the audit fails."""
    backend = wheel(tmp_path, "mayfly-gap", ["mayfly-no-such-distribution>=1"], {})
    completed = mayfly_audit(tmp_path, backend.name)
    assert completed.returncode == 1
    assert "PROBLEM mayfly-no-such-distribution>=1 is required but not installed here" in completed.stdout


def test_a_project_directory_is_audited_from_its_pyproject(tmp_path: Path) -> None:
    """A project's dependencies, extras and sources are audited; its tests may start threads."""
    project = tmp_path / "mystore"
    (project / "src" / "mystore").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "mayfly-mystore"
            version = "1.0"
            requires-python = ">=3.11.3"
            dependencies = ["mayfly-runtime", "msgspec"]
            [project.optional-dependencies]
            test = ["pytest>=8"]
            """
        )
    )
    (project / "src" / "mystore" / "__init__.py").write_text("import trio\n")
    (project / "tests" / "test_race.py").write_text("import threading\nthreading.Thread(target=print)\n")
    completed = mayfly_audit(tmp_path, "mystore")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    out = completed.stdout
    assert (
        "SOURCE src/mystore/__init__.py:1: banned-module: imports trio (distribution trio is banned)" in out
    )
    assert "tests/test_race.py" not in out
    assert "2 roots x 1 targets" in out


def test_a_requirements_file_is_audited(tmp_path: Path) -> None:
    """``-r FILE`` audits the requirements a deployment installs."""
    policy = policy_banning(tmp_path, "iniconfig")
    (tmp_path / "requirements.txt").write_text("# deployment\nmsgspec>=0.18\npytest>=8\n")
    completed = mayfly_audit(tmp_path, "-r", "requirements.txt", "--policy", str(policy))
    assert completed.returncode == 1
    assert "FORBIDDEN requirements requirements.txt -> pytest " in completed.stdout
    clean = mayfly_audit(tmp_path, "-r", "requirements.txt")
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_the_third_party_mode_never_reads_the_repository_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Auditing a wheel consults neither the lock nor the repository's own policy file."""

    def refuse(*args: object) -> object:
        raise AssertionError("the lock was read")

    monkeypatch.setattr(audit, "load_lock", refuse)
    backend = wheel(tmp_path, "mayfly-lockless", ["msgspec"], {"mayfly_lockless/__init__.py": ""})
    report, _ = audit.audit_outside([str(backend)])
    assert not report.failed


def test_an_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    """A target that is no wheel, project or installed distribution exits 2 naming it."""
    completed = mayfly_audit(tmp_path, "mayfly-not-installed-anywhere")
    assert completed.returncode == 2
    assert "'mayfly-not-installed-anywhere' is neither a wheel" in completed.stderr


def test_the_shipped_policy_is_the_repository_policy() -> None:
    """The policy shipped with the auditor is byte for byte the repository's policy file."""
    shipped = audit.PACKAGED_POLICY.read_bytes()
    assert shipped == (REPOSITORY / "policy" / "runtime-dependency-policy.toml").read_bytes()
    assert tomllib.loads(shipped.decode())["ledger"] == []
