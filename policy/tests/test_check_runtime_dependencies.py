"""The runtime-dependency audit, exercised on synthetic repositories and graphs.

Each test writes a small repository (pyproject files, tox.ini, noxfile, docs)
plus a dependency-graph lock describing an invented third-party graph, then
runs the audit exactly as the command line does. The real policy file is used,
so the banned list under test is the one we ship.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import check_runtime_dependencies as audit
import pytest

REAL_POLICY = Path(audit.__file__).resolve().parent / "runtime-dependency-policy.toml"
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
FLOOR = audit.FLOOR_VAR
FROM_3_11_3 = '["3.11.3", "3.12", "3.13", "3.14"]'

Graph = dict[str, dict[str, list[str]]]
"""name -> version -> Requires-Dist; the newest version of a name is used unless a pin says otherwise."""


def write(root: Path, rel: str, text: str) -> None:
    """Write a dedented file under ``root``."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def pyproject(
    name: str,
    deps: list[str] | None = None,
    *,
    extras: dict[str, list[str]] | None = None,
    groups: dict[str, list[Any]] | None = None,
    build: list[str] | None = None,
    requires_python: str = ">=3.11.3",
) -> str:
    """Render a minimal pyproject.toml."""
    lines = [
        "[build-system]",
        f"requires = {json.dumps(build or [])}",
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f'name = "{name}"',
        'version = "1.0"',
        f'requires-python = "{requires_python}"',
        f"dependencies = {json.dumps(deps or [])}",
        "",
        "[project.optional-dependencies]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in (extras or {}).items()]
    if groups:
        lines += ["", "[dependency-groups]"]
        for k, v in groups.items():
            items = ", ".join(
                json.dumps(i) if isinstance(i, str) else f'{{include-group = "{i["include-group"]}"}}'
                for i in v
            )
            lines.append(f"{k} = [{items}]")
    return "\n".join(lines) + "\n"


def make_lock(
    root: Path,
    graph: Graph,
    pins: dict[str, dict[str, str | None]] | None = None,
    policy: Path | None = None,
) -> None:
    """Write a lock for ``graph`` that matches the repository at ``root``.

    Every requirement in the repository and the graph resolves to the newest
    version of its name, except where ``pins`` maps name -> python -> version.
    """
    pol = audit.Policy.load(policy or root / audit.POLICY_FILE)
    repo = audit.load_repo(root, pol)
    reqs = [r for root_ in repo.roots for r in root_.requirements]
    reqs += [
        audit.Requirement.parse(t) for versions in graph.values() for ds in versions.values() for t in ds
    ]
    resolutions: dict[str, dict[str, dict[str, str | None]]] = {}
    for req in reqs:
        if req.name not in graph:
            continue
        newest = sorted(graph[req.name], key=lambda v: tuple(int(x) for x in v.split(".")))[-1]
        per_py = {py: (pins or {}).get(req.name, {}).get(py, newest) for py in PYTHONS}
        resolutions.setdefault(req.name, {})[req.specifier or "*"] = per_py
    data = {
        "format": audit.LOCK_FORMAT,
        "python_versions": list(pol.python_floors.values()),
        "repository_requirements": audit.repo_fingerprint(repo, pol),
        "resolutions": resolutions,
        "distributions": {
            n: {v: {"requires_python": "", "requires_dist": ds} for v, ds in vs.items()}
            for n, vs in graph.items()
        },
    }
    (root / audit.LOCK_FILE).write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


def without_comparators(text: str) -> str:
    """The policy text with its ``[[comparator]]`` tables removed (each runs to the next comment rule)."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.strip() == "[[comparator]]":
            skipping = True
        elif skipping and line.startswith("# ---"):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty synthetic repository carrying the real policy file, minus the tooling list and comparators.

    The real comparator names a nox session that these repositories lack; the
    comparator tests use ``comparator_repo``, which keeps it.
    """
    (tmp_path / "policy").mkdir()
    text = REAL_POLICY.read_text(encoding="utf-8")
    text = text.replace('requirements = ["tox>=4.20", "nox>=2024.4"]', "requirements = []")
    (tmp_path / audit.POLICY_FILE).write_text(without_comparators(text), encoding="utf-8")
    return tmp_path


@pytest.fixture
def comparator_repo(repo: Path) -> Path:
    """A synthetic repository whose policy keeps the real ``[[comparator]]`` (DBOS, nox session bench_dbos)."""
    text = REAL_POLICY.read_text(encoding="utf-8")
    text = text.replace('requirements = ["tox>=4.20", "nox>=2024.4"]', "requirements = []")
    (repo / audit.POLICY_FILE).write_text(text, encoding="utf-8")
    return repo


def set_python_targets(root: Path, entries: str) -> None:
    """Replace the policy's ``[targets] python_versions`` list with ``entries`` (TOML text)."""
    policy = root / audit.POLICY_FILE
    text = policy.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("python_versions = "))
    policy.write_text(text.replace(line, f"python_versions = {entries}"), encoding="utf-8")


def run(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    """Run the audit CLI on ``root``; return the exit status and everything printed."""
    code = audit.main(["--all-targets", "--root", str(root), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


BASE: Graph = {
    "msgspec": {"0.23.0": []},
    "foo": {"2.1": ['trio>=0.20; extra == "async"', 'colorama; sys_platform == "win32"']},
    "trio": {"0.27.0": ["sniffio", "outcome"]},
    "sniffio": {"1.3.1": []},
    "outcome": {"1.3.0": []},
    "colorama": {"0.4.6": []},
    "hatchling": {"1.27.0": []},
}


def test_clean_graph_passes(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A graph that reaches no banned distribution on any target exits 0 and says clean."""
    write(
        repo,
        "packages/mayfly/pyproject.toml",
        pyproject("mayfly", ["msgspec>=0.18", "foo"], build=["hatchling"]),
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "runtime-dependency audit clean" in out
    assert "24 targets" in out


def test_banned_through_our_extra_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A banned distribution reached only through one of our extras fails, printing the versioned path."""
    write(
        repo,
        "packages/mayfly/pyproject.toml",
        pyproject("mayfly", ["msgspec"], extras={"fancy": ["foo[async]"]}),
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert 'mayfly 1.0 [extra fancy] -> foo 2.1 [extras async] -> trio 0.27.0 [extra == "async"]' in out
    assert "(on all targets)" in out


def test_banned_through_third_party_extra_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Requesting a third-party extra that pulls a banned library fails; not requesting it passes."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo[async]"]))
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "mayfly 1.0 -> foo 2.1 [extras async] -> trio 0.27.0" in out
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo"]))
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 0, out


def test_banned_on_one_platform_only_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A marker true only on Windows still fails, and the report names only the Windows targets."""
    graph: Graph = {**BASE, "bar": {"1.0": ['gevent>=20; sys_platform == "win32"']}, "gevent": {"24.2.1": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["bar"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert 'mayfly 1.0 -> bar 1.0 -> gevent 24.2.1 [sys_platform == "win32"]' in out
    assert "py3.11: win32/AMD64, win32/ARM64" in out
    assert "linux" not in out.split("FORBIDDEN", 1)[1].split("\n", 1)[0]


def test_banned_on_one_python_version_only_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A marker true only below Python 3.12 fails on the 3.11 targets alone."""
    graph: Graph = {**BASE, "bar": {"1.0": ['uvloop; python_version < "3.12"']}, "uvloop": {"0.21.0": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["bar"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("FORBIDDEN"))
    assert "uvloop 0.21.0" in line
    assert "py3.11:" in line
    assert "py3.12" not in line


def test_full_version_marker_inside_our_range_is_caught(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A python_full_version marker that holds for the early audited 3.11 patch releases counts as reachable."""
    graph: Graph = {
        **BASE,
        "bar": {"1.0": ["anyio>=4; python_full_version < '3.11.5'"]},
        "anyio": {"4.6.0": []},
    }
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["bar"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "-> anyio 4.6.0" in out


def test_marker_false_everywhere_is_not_a_path(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An edge whose marker is false on every target (Python < 3.8) is not reported."""
    graph: Graph = {
        **BASE,
        "bar": {"1.0": ['trio; python_version < "3.8"', 'trio; sys_platform == "emscripten"']},
    }
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["bar"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 0, out


def test_banned_version_resolved_on_one_python_only_is_caught(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When an edge resolves to an older release on one Python, that release's graph is audited too."""
    graph: Graph = {**BASE, "bar": {"1.0": ["curio"], "2.0": []}, "curio": {"1.6": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["bar"]))
    make_lock(repo, graph, pins={"bar": {"3.11": "1.0"}})
    code, out = run(repo, capsys)
    assert code == 1
    assert "mayfly 1.0 -> bar 1.0 -> curio 1.6" in out
    assert "py3.12" not in next(line for line in out.splitlines() if line.startswith("FORBIDDEN"))


def test_banned_through_build_requirements_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A build backend that pulls a banned library fails the audit."""
    graph: Graph = {**BASE, "badbuild": {"3.0": ["twisted>=22"]}, "twisted": {"24.11.0": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], build=["badbuild>=3"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "mayfly 1.0 [build-system] -> badbuild 3.0 -> twisted 24.11.0" in out


def test_banned_through_dependency_group_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dependency group, including one reached through include-group, is audited."""
    graph: Graph = {
        **BASE,
        "sphinx-autobuild": {"2024.10.3": ["starlette>=0.35", "uvicorn>=0.25"]},
        "starlette": {"0.41.0": []},
        "uvicorn": {"0.32.0": []},
    }
    groups: dict[str, list[Any]] = {"docs": ["sphinx-autobuild"], "dev": [{"include-group": "docs"}]}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], groups=groups))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "mayfly 1.0 [group docs] -> sphinx-autobuild 2024.10.3 -> starlette 0.41.0" in out
    assert "mayfly 1.0 [group dev] -> sphinx-autobuild 2024.10.3 -> uvicorn 0.32.0" in out


def test_workspace_root_dependency_group_is_audited(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dependency groups in the workspace root pyproject (which has no [project]) are audited."""
    graph: Graph = {**BASE, "pytest-asyncio": {"1.5.0": []}}
    write(repo, "pyproject.toml", '[dependency-groups]\ntest = ["pytest-asyncio"]\n')
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "workspace root [group test] -> pytest-asyncio 1.5.0" in out


def test_tox_env_and_requirements_file_are_audited(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tox env's deps, including a -r requirements file and -e of our distribution, are audited."""
    graph: Graph = {**BASE, "livereload": {"2.7.0": ["tornado"]}, "tornado": {"6.4.1": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(repo, "docs/requirements.txt", "livereload  # the dev server\n")
    write(repo, "tox.ini", "[testenv:docs]\ndeps =\n    -e packages/mayfly\n    -r docs/requirements.txt\n")
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "tox.ini [testenv:docs] -> livereload 2.7.0 -> tornado 6.4.1" in out


def test_nox_session_installs_are_audited(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A package installed by a nox session is audited like any other root."""
    graph: Graph = {**BASE, "nest-asyncio": {"1.6.0": []}}
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(
        repo,
        "noxfile.py",
        """
        import nox

        @nox.session
        def bench(session):
            \"\"\"Run benchmarks.\"\"\"
            session.install("-e", "packages/mayfly", "nest-asyncio")
        """,
    )
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "noxfile.py [session bench] -> nest-asyncio 1.6.0" in out


def test_nox_install_of_a_computed_requirement_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session.install argument the audit cannot read fails closed; a computed -e path is accepted."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(
        repo,
        "noxfile.py",
        """
        import nox

        @nox.session
        def typecheck(session):
            \"\"\"Type-check.\"\"\"
            for path in ["packages/mayfly"]:
                session.install("-e", path)
            session.install(REQUIREMENT)
        """,
    )
    code, out = run(repo, capsys)
    assert code == 2
    assert "noxfile.py line 8: session.install takes a non-literal argument" in out


def test_banned_direct_dependency_of_a_backend_is_caught(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend reached through the core's extra is walked from the repository; its banned driver fails."""
    graph: Graph = {**BASE, "aioredis": {"2.0.1": ["async-timeout"]}, "async-timeout": {"4.0.3": []}}
    write(
        repo,
        "packages/mayfly/pyproject.toml",
        pyproject("mayfly", ["msgspec"], extras={"redis": ["mayfly-redis"]}),
    )
    write(repo, "packages/mayfly-redis/pyproject.toml", pyproject("mayfly-redis", ["mayfly", "aioredis>=2"]))
    make_lock(repo, graph)
    code, out = run(repo, capsys)
    assert code == 1
    assert "mayfly 1.0 [extra redis] -> mayfly-redis 1.0 -> aioredis 2.0.1" in out
    assert "mayfly-redis 1.0 -> aioredis 2.0.1" in out


def test_missing_first_party_backend_is_a_note_not_a_failure(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An extra naming a first-party backend that has no pyproject yet is reported as a note and passes."""
    write(
        repo,
        "packages/mayfly/pyproject.toml",
        pyproject("mayfly", ["msgspec"], extras={"lmdb": ["mayfly-lmdb"]}),
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "note: mayfly-lmdb is first-party but not in the repository yet" in out


def test_ledger_entry_admits_exactly_its_path(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledgered versioned path passes; the same path at another version fails."""
    policy = repo / audit.POLICY_FILE
    entry = '{ path = "mayfly 1.0 -> foo 2.1 -> trio 0.27.0", why = "remediation", tracking = "issue 1" }'
    policy.write_text(
        policy.read_text(encoding="utf-8").replace("ledger = []", f"ledger = [{entry}]"), encoding="utf-8"
    )
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo[async]"]))
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "ledgered  mayfly 1.0 -> foo 2.1" in out
    make_lock(repo, {**BASE, "trio": {"0.28.0": []}})
    code, out = run(repo, capsys)
    assert code == 1
    assert "FORBIDDEN mayfly 1.0 -> foo 2.1 [extras async] -> trio 0.28.0" in out
    assert "STALE LEDGER ENTRY 'mayfly 1.0 -> foo 2.1 -> trio 0.27.0'" in out


def test_stale_ledger_entry_is_caught(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger entry whose path no longer exists fails, so remediated exceptions must be removed."""
    policy = repo / audit.POLICY_FILE
    entry = '{ path = "mayfly 1.0 -> foo 2.1 -> trio 0.27.0", why = "fixed since", tracking = "issue 1" }'
    policy.write_text(
        policy.read_text(encoding="utf-8").replace("ledger = []", f"ledger = [{entry}]"), encoding="utf-8"
    )
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo"]))
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "STALE LEDGER ENTRY 'mayfly 1.0 -> foo 2.1 -> trio 0.27.0'" in out
    assert "0 forbidden path(s), ledger 1 entry (1 stale)" in out


def test_lock_that_misses_a_new_requirement_is_stale(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Adding a requirement without refreshing the lock exits 2 and names the requirement and the fix."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    make_lock(repo, BASE)
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec", "foo"]))
    code, out = run(repo, capsys)
    assert code == 2
    assert "new: foo" in out
    assert "--refresh" in out


def test_lock_that_keeps_a_removed_requirement_still_passes_with_a_note(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lock that covers more than the repository declares still covers it: a note, not a failure."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec", "foo"]))
    make_lock(repo, BASE)
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "note: the lock also covers 1 requirement(s) the repository no longer declares (e.g. foo)" in out


def test_missing_lock_is_stale(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a lock the audit cannot run offline and exits 2 asking for --refresh."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    code, out = run(repo, capsys)
    assert code == 2
    assert "no lock at" in out


def test_direct_url_requirement_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A direct URL reference cannot be audited, so it fails rather than passing unseen."""
    write(
        repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo @ https://example.invalid/foo.whl"])
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "a direct URL reference cannot be audited" in out


def test_requires_python_outside_audited_versions_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A distribution admitting Python 3.10, which the policy does not audit, exits 2 naming both."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], requires_python=">=3.10"))
    code, out = run(repo, capsys)
    assert code == 2
    assert "admits Python 3.10" in out


def test_requires_python_below_the_patch_floor_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 3.11 audited from 3.11.3, requires-python ">=3.11" admits unaudited 3.11.0 and exits 2."""
    set_python_targets(repo, FROM_3_11_3)
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], requires_python=">=3.11"))
    code, out = run(repo, capsys)
    assert code == 2
    assert "requires-python '>=3.11' admits Python 3.11.0, below the audited floor 3.11.3" in out


def test_requires_python_above_the_patch_floor_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A requires-python that excludes the audited floor 3.11.3 (">=3.11.5") exits 2 naming the floor."""
    set_python_targets(repo, FROM_3_11_3)
    write(
        repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], requires_python=">=3.11.5")
    )
    code, out = run(repo, capsys)
    assert code == 2
    assert "requires-python '>=3.11.5' excludes Python 3.11.3, which the policy audits" in out


def test_requires_python_admitting_a_late_patch_of_an_older_series_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Requires-python >=3.10.5 admits Python 3.10 releases the policy never audits, though not 3.10.0."""
    write(
        repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], requires_python=">=3.10.5")
    )
    code, out = run(repo, capsys)
    assert code == 2
    assert "admits Python 3.10, which the policy does not audit" in out


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ('["3.11.x", "3.12"]', "entry '3.11.x' is not X.Y or X.Y.Z"),
        ('["3.11.3", "3.11", "3.12"]', "names Python 3.11 twice"),
        ('["3.12", "3.11.3"]', "must ascend; '3.11.3' does not"),
        ("[]", "must be a non-empty list"),
    ],
)
def test_malformed_python_targets_are_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str], entries: str, message: str
) -> None:
    """A [targets] python_versions list the audit cannot read as ascending series exits 2 saying why."""
    set_python_targets(repo, entries)
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    code, out = run(repo, capsys)
    assert code == 2
    assert message in out


def test_a_name_both_banned_and_tolerated_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy that tolerates a banned distribution is refused, so a ban cannot be quietly undone."""
    policy = repo / audit.POLICY_FILE
    with policy.open("a", encoding="utf-8") as f:
        f.write('\n[[tolerated]]\nname = "Async_Timeout"\nwhy = "only acts inside a running loop"\n')
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    code, out = run(repo, capsys)
    assert code == 2
    assert "lists async-timeout both as [[banned]] and as [[tolerated]]" in out


def test_lock_refreshed_for_other_python_targets_is_stale(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lock whose resolutions were chosen for other releases (3.11.0, not 3.11.3) exits 2 asking for --refresh."""
    set_python_targets(repo, FROM_3_11_3)
    write(
        repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"], requires_python=">=3.11.3")
    )
    make_lock(repo, BASE)
    lock = repo / audit.LOCK_FILE
    data = json.loads(lock.read_text(encoding="utf-8"))
    data["python_versions"] = list(PYTHONS)
    lock.write_text(json.dumps(data), encoding="utf-8")
    code, out = run(repo, capsys)
    assert code == 2
    assert "was refreshed for Python ['3.11', '3.12', '3.13', '3.14']" in out
    assert "['3.11.3', '3.12.0', '3.13.0', '3.14.0']" in out
    assert "--refresh" in out


# --- async-timeout: banned, and unreachable from 3.11.3 ---------------------

REDIS: Graph = {
    **BASE,
    "redis": {"8.1.0": ["async-timeout>=4.0.3; python_full_version < '3.11.3'"]},
    "async-timeout": {"5.0.1": []},
}


def write_redis_backend(root: Path, requires_python: str) -> None:
    """A core and a Redis backend shaped like ours: mayfly[redis] -> mayfly-redis -> redis."""
    write(
        root,
        "packages/mayfly/pyproject.toml",
        pyproject("mayfly", ["msgspec"], extras={"redis": ["mayfly-redis"]}, requires_python=requires_python),
    )
    write(
        root,
        "packages/mayfly-redis/pyproject.toml",
        pyproject("mayfly-redis", ["mayfly", "redis>=8.1,<9"], requires_python=requires_python),
    )


def test_async_timeout_is_banned_not_tolerated() -> None:
    """The shipped policy bans async-timeout (and its module) and no longer lists it as tolerated."""
    policy = audit.Policy.load(REAL_POLICY)
    assert "async-timeout" in policy.banned
    assert policy.banned_modules["async_timeout"] == "async-timeout"
    assert "async-timeout" not in policy.tolerated


def test_async_timeout_is_reachable_while_python_3_11_0_is_supported(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Auditing 3.11 from 3.11.0 with requires-python ">=3.11", redis-py's async-timeout edge fails on 3.11."""
    set_python_targets(repo, '["3.11", "3.12", "3.13", "3.14"]')
    write_redis_backend(repo, ">=3.11")
    make_lock(repo, REDIS)
    code, out = run(repo, capsys)
    assert code == 1
    lines = [line for line in out.splitlines() if line.startswith("FORBIDDEN")]
    assert lines, out
    assert all("-> redis 8.1.0 -> async-timeout 5.0.1" in line for line in lines)
    assert "FORBIDDEN mayfly-redis 1.0 -> redis 8.1.0 -> async-timeout 5.0.1" in out
    assert "FORBIDDEN mayfly 1.0 [extra redis] -> mayfly-redis 1.0 -> redis 8.1.0 -> async-timeout" in out
    assert all("py3.11:" in line and "py3.12" not in line for line in lines)


def test_async_timeout_is_unreachable_from_python_3_11_3(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the shipped targets and requires-python ">=3.11.3", redis is walked and async-timeout never is."""
    write_redis_backend(repo, ">=3.11.3")
    make_lock(repo, REDIS)
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "0 forbidden path(s), ledger 0 entries (0 stale)" in out
    policy = audit.Policy.load(repo / audit.POLICY_FILE)
    loaded = audit.load_repo(repo, policy)
    provider, _ = audit.load_lock(repo / audit.LOCK_FILE, loaded, policy)
    reached = audit.walk(loaded, policy, provider, policy.targets).reached
    assert ("redis", "8.1.0") in reached
    assert not any(name == "async-timeout" for name, _ in reached)


def test_repository_audit_is_clean_with_an_empty_ledger_and_no_async_timeout() -> None:
    """The real repository passes on all targets with an empty ledger, reaching redis but never async-timeout."""
    root = REAL_POLICY.parent.parent
    report = audit.audit(root)
    assert not report.failed, (report.forbidden, report.problems, report.source)
    policy = audit.Policy.load(REAL_POLICY)
    assert policy.ledger == {}
    assert report.stats["targets"] == 24
    repo = audit.load_repo(root, policy)
    provider, _ = audit.load_lock(root / audit.LOCK_FILE, repo, policy)
    names = {name for name, _ in audit.walk(repo, policy, provider, policy.targets).reached}
    assert "redis" in names
    assert "async-timeout" not in names


def test_repository_admits_dbos_only_as_the_bench_dbos_comparator() -> None:
    """In the real repository DBOS is banned, and reached only as the pinned comparator of nox -s bench_dbos."""
    root = REAL_POLICY.parent.parent
    policy = audit.Policy.load(REAL_POLICY)
    assert "dbos" in policy.banned
    assert policy.comparators["dbos"].session == "bench_dbos"
    report = audit.audit(root)
    assert report.comparators == ["noxfile.py [session bench_dbos] -> dbos 3.4.0"]
    assert not report.failed


def test_json_output_lists_forbidden_paths(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json reports the same forbidden path with its ledger key and targets."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["foo[async]"]))
    make_lock(repo, BASE)
    code, out = run(repo, capsys, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["failed"] is True
    assert [f["key"] for f in data["forbidden"]] == ["mayfly 1.0 -> foo 2.1 -> trio 0.27.0"]
    assert len(data["forbidden"][0]["targets"]) == 24


# --- benchmark comparators --------------------------------------------------

COMPARED: Graph = {
    **BASE,
    "dbos": {"3.4.0": ["msgspec", 'aiosqlite>=0.20; extra == "aiosqlite"'], "3.5.0": ["msgspec"]},
    "aiosqlite": {"0.22.1": []},
}


def bench_noxfile(root: Path, requirement: str = "dbos==3.4.0", session: str = "bench_dbos") -> None:
    """A noxfile whose ``session`` installs the core and ``requirement``."""
    write(
        root,
        "noxfile.py",
        f"""
        import nox

        @nox.session
        def {session}(session):
            \"\"\"Mayfly beside the comparator.\"\"\"
            session.install("-e", "packages/mayfly")
            session.install("{requirement}")
        """,
    )


def test_comparator_is_admitted_in_its_own_session_only(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pinned comparator, required directly by its nox session, is reported, not forbidden."""
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    bench_noxfile(comparator_repo)
    make_lock(comparator_repo, COMPARED, pins={"dbos": dict.fromkeys(PYTHONS, "3.4.0")})
    code, out = run(comparator_repo, capsys)
    assert code == 0, out
    assert "comparator noxfile.py [session bench_dbos] -> dbos 3.4.0  (benchmark comparator" in out
    assert "FORBIDDEN" not in out


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("tox", "tox.ini [testenv:core] -> dbos 3.4.0"),
        ("other session", "noxfile.py [session bench] -> dbos 3.4.0"),
        ("dependency", "mayfly 1.0 -> dbos 3.4.0"),
        ("extra", "mayfly 1.0 [extra compare] -> dbos 3.4.0"),
    ],
)
def test_comparator_anywhere_else_is_forbidden(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str], where: str, path: str
) -> None:
    """The comparator reached from a tox env, another nox session or a distribution is a forbidden path."""
    deps = ["msgspec", "dbos==3.4.0"] if where == "dependency" else ["msgspec"]
    extras = {"compare": ["dbos==3.4.0"]} if where == "extra" else None
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", deps, extras=extras))
    bench_noxfile(comparator_repo)
    if where == "tox":
        write(comparator_repo, "tox.ini", "[testenv:core]\ndeps =\n    -e packages/mayfly\n    dbos==3.4.0\n")
    if where == "other session":
        text = (comparator_repo / "noxfile.py").read_text(encoding="utf-8")
        text += '\n@nox.session\ndef bench(session):\n    session.install("dbos==3.4.0")\n'
        (comparator_repo / "noxfile.py").write_text(text, encoding="utf-8")
    make_lock(comparator_repo, COMPARED, pins={"dbos": dict.fromkeys(PYTHONS, "3.4.0")})
    code, out = run(comparator_repo, capsys)
    assert code == 1, out
    assert f"FORBIDDEN {path}" in out
    assert (
        "dbos is a benchmark comparator: admitted only as dbos==3.4.0, required directly by nox session"
        in out
    )
    assert "comparator noxfile.py [session bench_dbos] -> dbos 3.4.0" in out  # its own session still is


def test_comparator_at_another_version_is_forbidden_and_its_entry_stale(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its own session installing another version than the pinned one is a forbidden path."""
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    bench_noxfile(comparator_repo, "dbos>=3.4")
    make_lock(comparator_repo, COMPARED)  # resolves to the newest, 3.5.0
    code, out = run(comparator_repo, capsys)
    assert code == 1, out
    assert "FORBIDDEN noxfile.py [session bench_dbos] -> dbos 3.5.0" in out
    assert "STALE COMPARATOR dbos: nox session bench_dbos does not install dbos==3.4.0" in out


def test_banned_distribution_below_the_comparator_is_forbidden(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exception is the comparator alone: a banned distribution it pulls still fails."""
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    bench_noxfile(comparator_repo, "dbos[aiosqlite]==3.4.0")
    make_lock(comparator_repo, COMPARED, pins={"dbos": dict.fromkeys(PYTHONS, "3.4.0")})
    code, out = run(comparator_repo, capsys)
    assert code == 1, out
    assert (
        "FORBIDDEN noxfile.py [session bench_dbos] -> dbos 3.4.0 [extras aiosqlite] -> aiosqlite 0.22.1"
        in out
    )


def test_comparator_without_its_session_is_stale(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A [[comparator]] whose nox session is gone fails, asking for the entry's removal."""
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    make_lock(comparator_repo, COMPARED)
    code, out = run(comparator_repo, capsys)
    assert code == 1, out
    assert "STALE COMPARATOR dbos: noxfile.py has no session bench_dbos" in out


def test_a_comparator_that_is_not_banned_is_a_usage_error(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A comparator must be [[banned]]: the category is an exception to a ban, never an admission."""
    policy = comparator_repo / audit.POLICY_FILE
    text = policy.read_text(encoding="utf-8").replace('name = "dbos"\nversion', 'name = "dbos-lite"\nversion')
    policy.write_text(text, encoding="utf-8")
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    code, out = run(comparator_repo, capsys)
    assert code == 2
    assert "[[comparator]] dbos-lite is not [[banned]]" in out


def test_comparator_modules_are_importable_only_from_its_sources(
    comparator_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only files under the comparator's sources may import it, and the rest of the scan still covers them."""
    write(comparator_repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    bench_noxfile(comparator_repo)
    write(comparator_repo, "packages/mayfly-postgres/benchmarks/dbos/dbos_side.py", "from dbos import DBOS\n")
    write(
        comparator_repo,
        "packages/mayfly-postgres/benchmarks/dbos/loop.py",
        "import dbos\nimport asyncio\n",
    )
    write(comparator_repo, "packages/mayfly-postgres/benchmarks/bench_x.py", "import dbos\n")
    make_lock(comparator_repo, COMPARED, pins={"dbos": dict.fromkeys(PYTHONS, "3.4.0")})
    code, out = run(comparator_repo, capsys)
    assert code == 1, out
    assert "benchmarks/bench_x.py:1: banned-module: imports dbos (distribution dbos is banned)" in out
    assert "benchmarks/dbos/loop.py:2: asyncio: imports asyncio" in out
    assert "dbos_side.py" not in out
    assert "loop.py:1:" not in out


# --- source scan -----------------------------------------------------------


def test_source_scan_flags_asyncio_async_and_banned_imports(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """asyncio imports, async def, await and banned module imports in our source fail with a location."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(
        repo,
        "packages/mayfly/src/mayfly/bad.py",
        """
        import asyncio
        from trio import sleep

        async def handler():
            await sleep(1)
            async with lock:
                pass
        """,
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "packages/mayfly/src/mayfly/bad.py:1: asyncio: imports asyncio" in out
    assert "bad.py:2: banned-module: imports trio (distribution trio is banned)" in out
    assert "bad.py:4: async: async def handler" in out
    assert "bad.py:5: async: await expression" in out
    assert "bad.py:6: async: async with" in out


def test_source_scan_flags_threads_outside_the_substrate(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Thread and executor creation fails outside mayfly/substrate and is allowed inside it."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    threads = """
        import threading
        from concurrent.futures import ThreadPoolExecutor as Pool
        import multiprocessing
        import subprocess

        t = threading.Thread(target=print)
        p = Pool(4)

        class Worker(threading.Thread):
            pass

        proc = multiprocessing.Process(target=print)
        subprocess.run(["true"])
        """
    write(repo, "packages/mayfly/src/mayfly/runtime/pool.py", threads)
    write(repo, "packages/mayfly/src/mayfly/substrate/offload.py", threads)
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "runtime/pool.py:6: thread: threading.Thread(...) outside the substrate" in out
    assert "runtime/pool.py:7: thread: concurrent.futures.ThreadPoolExecutor(...)" in out
    assert "runtime/pool.py:9: thread: class Worker subclasses threading.Thread" in out
    assert "substrate/offload.py" not in out
    assert "multiprocessing.Process" not in out


def test_tests_may_start_threads_but_never_an_event_loop(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tests may race threads against our code, but asyncio in a test still fails."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(
        repo,
        "packages/mayfly/tests/test_race.py",
        """
        from concurrent.futures import ThreadPoolExecutor
        import asyncio

        with ThreadPoolExecutor(4) as pool:
            pass
        """,
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "packages/mayfly/tests/test_race.py:2: asyncio: imports asyncio" in out
    assert "thread" not in out


def test_source_scan_reads_python_blocks_in_docs(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fenced python example in the docs that runs an event loop fails, located by file and line."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec"]))
    write(
        repo,
        "docs/tutorial.md",
        """
        # Tutorial

        ```python
        import mayfly
        ```

        ```python
        import asyncio
        asyncio.run(main())
        ```

        ```console
        $ python -c "import asyncio"
        ```
        """,
    )
    make_lock(repo, BASE)
    code, out = run(repo, capsys)
    assert code == 1
    assert "docs/tutorial.md:8: asyncio: imports asyncio" in out
    assert "docs/tutorial.md:9: asyncio: calls asyncio.run" in out
    assert "tutorial.md:13" not in out


# --- markers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("marker", "env", "extras", "expected"),
    [
        ('python_version < "3.12"', {"python_version": "3.11"}, (), True),
        ('python_version < "3.12"', {"python_version": "3.12"}, (), False),
        ('"3.12" > python_version', {"python_version": "3.11"}, (), True),
        ("python_version == '3.1.*'", {"python_version": "3.11"}, (), False),
        ('python_version == "3.*"', {"python_version": "3.13"}, (), True),
        ('python_version ~= "3.11"', {"python_version": "3.14"}, (), True),
        ('python_full_version < "3.11.3"', {"python_version": "3.11"}, (), None),
        ('python_full_version < "3.11.3"', {"python_version": "3.12"}, (), False),
        ('python_full_version >= "3.8"', {"python_version": "3.11"}, (), True),
        ('python_full_version < "3.11.3"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), False),
        ('"3.11.3" > python_full_version', {"python_version": "3.11", FLOOR: "3.11.3"}, (), False),
        ('python_full_version < "3.11.5"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), None),
        ('python_full_version >= "3.11.3"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), True),
        ('implementation_version < "3.11.3"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), False),
        ('python_full_version == "3.11.1"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), False),
        ('python_full_version == "3.11.*"', {"python_version": "3.11", FLOOR: "3.11.3"}, (), True),
        ('python_full_version == "3.11.5"', {"python_version": "3.11"}, (), None),
        ('python_full_version != "3.11.5"', {"python_version": "3.11"}, (), None),
        ('python_full_version === "3.11.5"', {"python_version": "3.11"}, (), None),
        ('python_full_version == "3.11.5.*"', {"python_version": "3.11"}, (), None),
        ('python_full_version == "3.12.1"', {"python_version": "3.11"}, (), False),
        ('python_full_version < "3.11.3"', {"python_version": "3.11", FLOOR: "3.12.0"}, (), None),
        ('extra == "Async_IO"', {}, ("async-io",), True),
        ('extra == "async"', {}, (), False),
        ('sys_platform == "win32" or extra == "x"', {"sys_platform": "linux"}, ("x",), True),
        ('(sys_platform == "win32" and extra == "x")', {"sys_platform": "linux"}, ("x",), False),
        ('platform_release >= "5"', {}, (), None),
        ('platform_release == "5" and sys_platform == "darwin"', {"sys_platform": "linux"}, (), False),
        ('"linux" in sys_platform', {"sys_platform": "linux"}, (), True),
        ('os.name == "nt"', {"os_name": "nt"}, (), True),
    ],
)
def test_marker_evaluation(
    marker: str, env: dict[str, str], extras: tuple[str, ...], expected: bool | None
) -> None:
    """Markers evaluate to True/False where decidable and to None ("possibly") where not."""
    assert audit.Marker(marker).evaluate(env, extras) is expected


def test_marker_evaluation_agrees_with_packaging_on_the_lock() -> None:
    """Every marker in the committed lock evaluates as packaging does on every target, where decidable."""
    from packaging.markers import Marker as Reference

    policy = audit.Policy.load(REAL_POLICY)
    lock = json.loads((REAL_POLICY.parent / "dependency-graph.lock.json").read_text(encoding="utf-8"))
    texts = {
        t.split(";", 1)[1]
        for versions in lock["distributions"].values()
        for meta in versions.values()
        for t in meta["requires_dist"]
        if ";" in t
    }
    texts |= {
        'python_full_version < "3.11.3"',
        'python_full_version >= "3.11.3"',
        'implementation_version <= "3.11.2"',
        'platform_machine == "aarch64" and sys_platform == "linux"',
    }
    checked = 0
    for text in sorted(texts):
        ours = audit.Marker(text)
        for target in policy.targets:
            # A decided answer must hold at both ends of the target's range of patch releases.
            floor = policy.python_floors[target.python]
            for full in (floor, target.python + ".99"):
                for extra in ("", "test", "docs"):
                    mine = ours.evaluate(target.env, [extra] if extra else [])
                    if mine is None:
                        continue
                    env = {**target.env, "python_full_version": full, "extra": extra}
                    env["implementation_version"] = full
                    env.setdefault("platform_release", "")
                    env.setdefault("platform_version", "")
                    assert mine is Reference(text).evaluate(env), (text, target.label, full, extra)
                    checked += 1
    assert checked > 100


def test_malformed_marker_is_an_audit_error() -> None:
    """A marker that does not parse raises AuditError naming it, never evaluating to a guess."""
    with pytest.raises(audit.AuditError, match="malformed environment marker"):
        audit.Marker('python_version < "3.12" and')


def test_requirement_parsing_normalizes_names_extras_and_specifiers() -> None:
    """Names and extras are canonicalized and specifier clauses sorted, so lock keys are stable."""
    req = audit.Requirement.parse("Foo_Bar[Async,b] (<3, >=1.0) ; python_version<'3.12'")
    assert req.name == "foo-bar"
    assert req.extras == frozenset({"async", "b"})
    assert req.specifier == "<3,>=1.0"
    assert req.describe() == "foo-bar[async,b]<3,>=1.0; python_version<'3.12'"


def test_new_root_reusing_known_requirements_needs_no_refresh(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new tox env that installs our distributions and already-locked requirements passes without --refresh."""
    write(repo, "packages/mayfly/pyproject.toml", pyproject("mayfly", ["msgspec>=0.18", "foo"]))
    write(repo, "tox.ini", "[testenv:core]\ndeps =\n    -e packages/mayfly\n    foo\n")
    make_lock(repo, BASE)
    write(
        repo,
        "tox.ini",
        "[testenv:core]\ndeps =\n    -e packages/mayfly\n    foo\n\n[testenv:again]\ndeps =\n    -e packages/mayfly\n",
    )
    code, out = run(repo, capsys)
    assert code == 0, out
