"""Every distribution as a user gets it: built wheels, installed by the docs' own commands.

The session builds one wheel of every distribution of the repository into a
wheelhouse (``pip wheel --no-deps``). Each install case then makes a fresh
virtual environment and runs an install command exactly as the docs write it,
with ``--find-links WHEELHOUSE`` added: our distributions come from the
wheelhouse, everything else from the index beside it, as it will for a user
once they are published. The test asserts what got installed (first-party
distributions from the wheelhouse at the repository's versions, exactly the
expected backends and drivers, nothing outside the requirements' closure) and
runs ``mayfly demo --auto-approve`` on the case's backend.

The install commands are read from the docs: every ``pip install`` line of
the Markdown pages and READMEs that installs published distributions must be
a case here, and every case must be written in the docs, so a doc command
nobody runs (or a case no doc shows) fails.

The servers are the ones .ci/run starts on loopback: PostgreSQL (one schema per
run, dropped after) and Redis (a key prefix per run, deleted after).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
import zipfile
from dataclasses import dataclass
from importlib.metadata import Distribution, distributions
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION_DIRS = [
    "packages/mayfly",
    "packages/mayfly-lmdb",
    "packages/mayfly-redis",
    "packages/mayfly-postgres",
    "contract-tests",
    "contract-tests/examples/mayfly-example-sqlite",
]
CORE = "mayfly-runtime"
BACKENDS = ("mayfly-lmdb", "mayfly-redis", "mayfly-postgres")
# What each backend brings: an install without the backend has none of these.
BACKEND_DISTRIBUTIONS = {
    "mayfly-lmdb": frozenset({"mayfly-lmdb", "lmdb"}),
    "mayfly-redis": frozenset({"mayfly-redis", "redis"}),
    "mayfly-postgres": frozenset({"mayfly-postgres", "psycopg", "psycopg-binary"}),
}
# Names the docs use for a third party's own distribution, never ours.
PLACEHOLDERS = frozenset({"mayfly-yourbackend"})
# The PyPI name `mayfly` is an unrelated 0.0.0 placeholder: no command may install it.
NOT_OURS = "mayfly"
DOC_FILES = sorted(
    {
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *ROOT.glob("packages/*/README.md"),
        ROOT / "contract-tests" / "README.md",
        *ROOT.glob("contract-tests/examples/*/README.md"),
    }
    - set((ROOT / "docs").glob("_build/**/*.md"))
)
POSTGRES = os.environ.get("MAYFLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = "redis://127.0.0.1:6379/0"
PIP_TIMEOUT = 600


def _name(name: str) -> str:
    return str(canonicalize_name(name))


def _marker_env(extra: str) -> dict[str, str]:
    env = {key: str(value) for key, value in default_environment().items()}
    env["extra"] = extra
    return env


def _project(directory: str) -> dict[str, object]:
    project = tomllib.loads((ROOT / directory / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert isinstance(project, dict)
    return project


PROJECTS = {_name(str(_project(d)["name"])): _project(d) for d in DISTRIBUTION_DIRS}
VERSIONS = {name: str(project["version"]) for name, project in PROJECTS.items()}
FIRST_PARTY = frozenset(PROJECTS)


@dataclass(frozen=True)
class Case:
    """One install command of the docs and what it must produce."""

    command: str  # as the docs write it, without the leading "$ "
    first_party: frozenset[str]  # exactly these of our distributions get installed
    drivers: frozenset[str]  # exactly these third-party requirements (name[extras]) of ours apply
    backend: str  # the journal the demo runs on: file, lmdb, redis or postgres


CORE_DRIVERS = frozenset({"msgspec", "greenlet", "pluggy", "cronsim"})
CONTRACT_DRIVERS = frozenset({"pytest", "hypothesis"})
CASES = [
    Case("pip install mayfly-runtime", frozenset({CORE}), CORE_DRIVERS, "file"),
    Case(
        'pip install "mayfly-runtime[postgres]"',
        frozenset({CORE, "mayfly-postgres"}),
        CORE_DRIVERS | {"psycopg[binary]"},
        "postgres",
    ),
    Case(
        'pip install "mayfly-runtime[redis]"',
        frozenset({CORE, "mayfly-redis"}),
        CORE_DRIVERS | {"redis"},
        "redis",
    ),
    Case(
        'pip install "mayfly-runtime[lmdb]"',
        frozenset({CORE, "mayfly-lmdb"}),
        CORE_DRIVERS | {"lmdb"},
        "lmdb",
    ),
    Case(
        'pip install "mayfly-runtime[otel]"',
        frozenset({CORE}),
        CORE_DRIVERS,  # the extra adds opentelemetry-api to the core; no distribution of ours requires it
        "file",
    ),
    Case(
        "pip install mayfly-contract",
        frozenset({CORE, "mayfly-contract"}),
        CORE_DRIVERS | CONTRACT_DRIVERS,
        "file",
    ),
    Case(
        'pip install mayfly-contract "mayfly-runtime[lmdb]"',
        frozenset({CORE, "mayfly-contract", "mayfly-lmdb"}),
        CORE_DRIVERS | CONTRACT_DRIVERS | {"lmdb"},
        "lmdb",
    ),
]


# --- What the docs write ------------------------------------------------------------------------


@dataclass(frozen=True)
class DocCommand:
    where: str
    command: str
    args: tuple[str, ...]


def doc_install_commands() -> list[DocCommand]:
    """Every ``pip install`` command line of the docs (``$ `` prompts and trailing comments dropped)."""
    found = []
    for path in DOC_FILES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = line.strip().removeprefix("$ ")
            if not text.startswith("pip install "):
                continue
            args = tuple(shlex.split(text, comments=True))[2:]
            where = f"{path.relative_to(ROOT).as_posix()}:{number}"
            found.append(DocCommand(where, _spelled(text), args))
    return found


def _spelled(text: str) -> str:
    """The command as written, without a trailing ``# comment``."""
    return re.sub(r"\s+#.*$", "", text).strip()


def _is_local(arg: str) -> bool:
    return arg.startswith((".", "/")) or "/" in arg or arg.endswith(".whl")


def _requirements(args: tuple[str, ...]) -> list[Requirement]:
    reqs = []
    for arg in args:
        if arg.startswith("-") or _is_local(arg):
            continue
        reqs.append(Requirement(arg))
    return reqs


def test_no_doc_command_installs_the_placeholder_name() -> None:
    """No doc, pyproject or CLI hint asks for the distribution ``mayfly``: on PyPI it is not ours."""
    for command in doc_install_commands():
        names = {_name(r.name) for r in _requirements(command.args)}
        assert NOT_OURS not in names, f"{command.where}: {command.command} installs PyPI's placeholder"
        unknown = {n for n in names if n.startswith("mayfly") and n not in FIRST_PARTY | PLACEHOLDERS}
        assert not unknown, f"{command.where}: {command.command} names no distribution of ours: {unknown}"
    for name, project in PROJECTS.items():
        declared = [*project.get("dependencies", [])]  # type: ignore[misc]
        for extra in project.get("optional-dependencies", {}).values():  # type: ignore[attr-defined]
            declared.extend(extra)
        assert NOT_OURS not in {_name(Requirement(r).name) for r in declared}, name


def _check_hint(requirement: str, where: str) -> None:
    req = Requirement(requirement)
    name = _name(req.name)
    assert name != NOT_OURS, f"{where}: the hint installs PyPI's placeholder `mayfly`"
    if name in FIRST_PARTY:
        extras = PROJECTS[name].get("optional-dependencies", {})
        assert isinstance(extras, dict)
        assert set(req.extras) <= set(extras), f"{where}: {requirement} names an extra {name} lacks"


def test_install_hints_in_the_sources_name_our_distributions() -> None:
    """The not-installed hints (``KNOWN_BACKEND_DISTRIBUTIONS``) and ``pip install`` in docstrings are ours."""
    plugins = ROOT / "packages/mayfly/src/mayfly/plugins.py"
    tree = ast.parse(plugins.read_text(encoding="utf-8"))
    (table,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "KNOWN_BACKEND_DISTRIBUTIONS"
    ]
    assert isinstance(table, ast.Dict)
    hints = {
        ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(table.keys, table.values, strict=True) if k
    }
    assert hints["file"] == CORE
    for scheme, backend in [("postgresql", "postgres"), ("redis", "redis"), ("lmdb", "lmdb")]:
        assert hints[scheme] == f"{CORE}[{backend}]"
    for requirement in hints.values():
        _check_hint(requirement, "mayfly.plugins.KNOWN_BACKEND_DISTRIBUTIONS")
    sources = [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("contract-tests/src/**/*.py")]
    seen = 0
    for source in sources:
        for match in re.finditer(
            r'pip install "?([A-Za-z0-9][A-Za-z0-9_.\-]*(?:\[[a-z,]+\])?)', source.read_text()
        ):
            seen += 1
            _check_hint(match.group(1), source.relative_to(ROOT).as_posix())
    assert seen >= 3, "the backends' docstrings name their install command"


def test_doc_commands_are_exactly_the_install_cases() -> None:
    """Each index install command of the docs is an install case below, and each case is in the docs."""
    commands = doc_install_commands()
    assert commands, "no pip install command found in the docs"
    index: dict[str, str] = {}
    for command in commands:
        if any(a.startswith("-e") or _is_local(a) for a in command.args):
            # From a checkout: every path named must be a distribution of the repository (the tox
            # envs install these), or the docs' placeholder for a third party's own wheel.
            for arg in command.args:
                if _is_local(arg) and not arg.endswith(".whl"):
                    assert (ROOT / arg / "pyproject.toml").is_file(), f"{command.where}: {arg}"
            continue
        names = {_name(r.name) for r in _requirements(command.args)}
        if names & PLACEHOLDERS:
            assert names - PLACEHOLDERS <= FIRST_PARTY, command.where
            continue
        index.setdefault(command.command, command.where)
    assert set(index) == {case.command for case in CASES}, index


def test_every_release_is_final_and_requires_a_compatible_core() -> None:
    """No pre-release (an installer prefers any final release over it); first-party pins are ranges.

    Every requirement of one first-party distribution on another admits that
    distribution's version in this repository and has an upper bound, so a
    future incompatible series is never paired with it.
    """
    for name, version in VERSIONS.items():
        parsed = Version(version)
        assert not (parsed.is_prerelease or parsed.is_devrelease), f"{name} {version} is a pre-release"
    for name, project in PROJECTS.items():
        declared = [*project.get("dependencies", [])]  # type: ignore[misc]
        for extra in project.get("optional-dependencies", {}).values():  # type: ignore[attr-defined]
            declared.extend(extra)
        for text in declared:
            req = Requirement(text)
            other = _name(req.name)
            if other not in FIRST_PARTY:
                continue
            assert req.specifier.contains(VERSIONS[other]), f"{name}: {text} excludes {VERSIONS[other]}"
            assert any(s.operator in {"<", "<=", "~=", "=="} for s in req.specifier), (
                f"{name}: {text} has no upper bound"
            )
    for backend in (*BACKENDS, "mayfly-contract", "mayfly-example-sqlite"):
        cores = [Requirement(r) for r in PROJECTS[backend]["dependencies"]]  # type: ignore[attr-defined]
        assert [r.name for r in cores if _name(r.name) == CORE] == [CORE], backend
    init = (ROOT / "packages/mayfly/src/mayfly/__init__.py").read_text(encoding="utf-8")
    assert f'__version__ = "{VERSIONS[CORE]}"' in init


# --- The wheelhouse and fresh environments -------------------------------------------------------


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"} and not k.startswith("MAYFLY_")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(command: list[str], cwd: Path, timeout: float = PIP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        command, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert completed.returncode == 0, (
        f"{shlex.join(command)} exited {completed.returncode}\n{completed.stdout[-4000:]}\n"
        f"{completed.stderr[-4000:]}"
    )
    return completed


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel of every distribution, built once for the session."""
    out = tmp_path_factory.mktemp("wheelhouse")
    dirs = [str(ROOT / d) for d in DISTRIBUTION_DIRS]
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), *dirs], cwd=out)
    built = sorted(p.name for p in out.glob("*.whl"))
    expected = sorted(f"{n.replace('-', '_')}-{v}-py3-none-any.whl" for n, v in VERSIONS.items())
    assert built == expected
    return out


@dataclass
class Venv:
    path: Path
    baseline: frozenset[str]

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def site(self) -> Path:
        (site,) = self.path.glob("lib/python*/site-packages")
        return site

    def dists(self) -> dict[str, Distribution]:
        return {_name(d.metadata["Name"]): d for d in distributions(path=[str(self.site())])}


def make_venv(path: Path) -> Venv:
    _run([sys.executable, "-m", "venv", str(path)], cwd=path.parent, timeout=300)
    venv = Venv(path, frozenset())
    venv.baseline = frozenset(venv.dists())  # pip (and setuptools on 3.11), before any install
    return venv


def pip_install(venv: Venv, args: tuple[str, ...], wheelhouse: Path, report: Path) -> None:
    """Run ``pip install ARGS`` in ``venv`` as the docs write it, finding our wheels in the wheelhouse."""
    command = [str(venv.bin / "pip"), "install", "--find-links", str(wheelhouse), "--report", str(report)]
    _run([*command, *args], cwd=venv.path.parent)


def closure(venv: Venv, roots: list[Requirement]) -> set[str]:
    """Every distribution the roots require, transitively, by the installed metadata and its markers."""
    dists = venv.dists()
    done: set[tuple[str, str]] = set()
    todo = [(_name(r.name), extra) for r in roots for extra in {"", *r.extras}]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        assert name in dists, f"{name} is required but was not installed"
        for text in dists[name].requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(_marker_env(extra)):
                continue
            todo.extend((_name(req.name), e) for e in {"", *req.extras})
    return {name for name, _ in done}


def first_party_drivers(venv: Venv, installed: set[str]) -> set[str]:
    """The third-party requirements of our installed distributions, as ``name[extras]`` (markers applied)."""
    dists = venv.dists()
    out: set[str] = set()
    for name in installed & FIRST_PARTY:
        for text in dists[name].requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(_marker_env("")):
                continue
            if _name(req.name) not in FIRST_PARTY:
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                out.add(f"{_name(req.name)}{extras}")
    return out


def check_report(report: Path, wheelhouse: Path, expected: frozenset[str]) -> None:
    """Each first-party distribution pip chose is our wheel from the wheelhouse, at the repository's version."""
    items = json.loads(report.read_text(encoding="utf-8"))["install"]
    chosen = {_name(i["metadata"]["name"]): i for i in items}
    assert NOT_OURS not in chosen, "pip chose the PyPI placeholder `mayfly`"
    assert set(chosen) & FIRST_PARTY == expected
    for name in expected:
        item = chosen[name]
        assert item["metadata"]["version"] == VERSIONS[name]
        url = item["download_info"]["url"]
        assert url.startswith("file://") and Path(url.removeprefix("file://")).parent == wheelhouse, (
            name,
            url,
        )
    for name, item in chosen.items():
        if name not in FIRST_PARTY:
            assert not item["download_info"]["url"].startswith(f"file://{wheelhouse}"), name


def demo(venv: Venv, url: str, cwd: Path) -> str:
    """``mayfly --journal URL demo --auto-approve``; the run must end succeeded."""
    out = _run([str(venv.bin / "mayfly"), "--journal", url, "demo", "--auto-approve"], cwd=cwd).stdout
    assert re.search(r"^status\s+succeeded \(terminal\)$", out, re.MULTILINE), out[-3000:]
    return out


def cleanup(venv: Venv, backend: str, url: str, cwd: Path) -> None:
    if backend == "postgres":
        _run([str(venv.bin / "python"), "-m", "mayfly_postgres", "drop", "--yes", url], cwd=cwd)
    elif backend == "redis":
        prefix = url.rsplit("prefix=", 1)[1]
        script = (
            "import sys, redis\n"
            "r = redis.Redis.from_url(sys.argv[1])\n"
            "keys = list(r.scan_iter(match=sys.argv[2] + ':*', count=1000))\n"
            "r.delete(*keys) if keys else None\n"
        )
        _run([str(venv.bin / "python"), "-c", script, REDIS, prefix], cwd=cwd)


@pytest.mark.parametrize("case", CASES, ids=[c.command.removeprefix("pip install ") for c in CASES])
def test_doc_install_command(case: Case, wheelhouse: Path, tmp_path: Path) -> None:
    """The command installs exactly its distributions from the wheelhouse, and the demo runs on it."""
    venv = make_venv(tmp_path / "venv")
    args = tuple(shlex.split(case.command))[2:]
    pip_install(venv, args, wheelhouse, tmp_path / "report.json")
    check_report(tmp_path / "report.json", wheelhouse, case.first_party)

    installed = set(venv.dists()) - venv.baseline
    assert installed & FIRST_PARTY == case.first_party
    assert NOT_OURS not in installed
    for backend, brought in BACKEND_DISTRIBUTIONS.items():
        if backend not in case.first_party:
            assert not brought & installed, f"{case.command} installed {sorted(brought & installed)}"
    assert first_party_drivers(venv, installed) == case.drivers
    assert installed == closure(venv, _requirements(args)), "installed beyond the requirements' closure"

    version = _run([str(venv.bin / "mayfly"), "--version"], cwd=tmp_path).stdout.strip()
    assert version == f"mayfly {VERSIONS[CORE]}"
    backend = case.backend
    tag = uuid.uuid4().hex[:12]
    url = {
        "file": f"file://{tmp_path / 'journal'}",
        "lmdb": f"lmdb://{tmp_path / 'lmdb'}",
        "postgres": f"{POSTGRES}?schema=wheels_{tag}",
        "redis": f"{REDIS}?durability=memory&prefix=wheels-{tag}",
    }[backend]
    try:
        out = demo(venv, url, tmp_path)
        scheme = "postgresql" if backend == "postgres" else backend
        assert re.search(rf"^journal: {scheme}://", out, re.MULTILINE), out[:500]
    finally:
        cleanup(venv, backend, url, tmp_path)
    if "mayfly-contract" in case.first_party:
        contract(venv, url, tmp_path)


def contract(venv: Venv, url: str, cwd: Path) -> None:
    """The installed suite is a pytest plugin that certifies the installed backend (a quick clause subset)."""
    completed = _run(
        [
            str(venv.bin / "pytest"),
            "--pyargs",
            "mayfly_contract",
            "--mayfly-journal",
            url,
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "test_append",
        ],
        cwd=cwd,
    )
    assert re.search(r"\d+ passed", completed.stdout), completed.stdout[-3000:]


def test_a_backend_alone_pulls_the_core_from_the_wheelhouse(wheelhouse: Path, tmp_path: Path) -> None:
    """``pip install mayfly-postgres`` brings our core, not the placeholder, and the backend imports."""
    venv = make_venv(tmp_path / "venv")
    pip_install(venv, ("mayfly-postgres",), wheelhouse, tmp_path / "report.json")
    check_report(tmp_path / "report.json", wheelhouse, frozenset({CORE, "mayfly-postgres"}))
    _run([str(venv.bin / "python"), "-c", "import mayfly, mayfly_postgres"], cwd=tmp_path)
    assert (venv.bin / "mayfly").is_file()


def _placeholder_wheel(directory: Path, version: str) -> Path:
    """A wheel named like our core at ``version`` with nothing in it, like the placeholder on PyPI."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{CORE.replace('-', '_')}-{version}"
    wheel = directory / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {CORE}\nVersion: {version}\n"
        )
        archive.writestr(
            f"{stem}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{stem}.dist-info/RECORD", "")
    return wheel


def _chosen(venv_pip: Path, links: list[Path], requirement: str, cwd: Path) -> tuple[str, str]:
    report = cwd / f"report-{uuid.uuid4().hex[:8]}.json"
    command = [str(venv_pip), "install", "--dry-run", "--no-index", "--no-deps", "--report", str(report)]
    for link in links:
        command += ["--find-links", str(link)]
    _run([*command, requirement], cwd=cwd)
    (item,) = json.loads(report.read_text(encoding="utf-8"))["install"]
    return item["metadata"]["version"], item["download_info"]["url"]


def test_a_placeholder_release_beside_ours_loses(wheelhouse: Path, tmp_path: Path) -> None:
    """The old failure mode: a 0.0.0 placeholder beside a pre-release wins; beside our final release it loses.

    A pre-release is chosen only when no final release matches, so the index's
    placeholder beat our ``0.1.0.dev0``. The same placeholder beside our wheel
    (offline, both as find-links) now loses to it.
    """
    venv = make_venv(tmp_path / "venv")
    squatter = tmp_path / "index"
    _placeholder_wheel(squatter, "0.0.0")
    version, url = _chosen(venv.bin / "pip", [squatter, wheelhouse], CORE, tmp_path)
    assert version == VERSIONS[CORE]
    assert Path(url.removeprefix("file://")).parent == wheelhouse
    prerelease = tmp_path / "prerelease"
    _placeholder_wheel(prerelease, "0.1.0.dev0")
    version, url = _chosen(venv.bin / "pip", [squatter, prerelease], CORE, tmp_path)
    assert version == "0.0.0", "the mechanism the old version fell to: a final release beats a pre-release"


def test_doc_files_exist() -> None:
    """The scan covers the pages it names (a moved README would silently drop its commands)."""
    assert ROOT / "README.md" in DOC_FILES and ROOT / "docs" / "index.md" in DOC_FILES
