"""Maintainer tasks for the Mayfly workspace. List them with ``nox -l``; run one with ``nox -s NAME``.

Isolated per-distribution test envs live in tox.ini (``nox -s tests`` runs them).
Every requirement installed here is a string literal, because the runtime-
dependency audit reads this file: after changing one, run
``python3 policy/check_runtime_dependencies.py --refresh`` and commit the lock.
``nox -s sim -- --backend B --seeds N`` runs the seeded simulator
(``python -m mayfly_contract.sim``; docs/testing.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "audit", "docs"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
TRIPWIRE_ENV = {"PYTHONPATH": str(ROOT / "policy")}


def _distributions() -> list[Path]:
    """Every distribution in the repository, core first so later ones find ``mayfly-runtime`` installed."""
    core = ROOT / "packages" / "mayfly"
    others = sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml") if p.parent != core)
    contract = [p.parent for p in [ROOT / "contract-tests" / "pyproject.toml"] if p.is_file()]
    examples = sorted(p.parent for p in ROOT.glob("contract-tests/examples/*/pyproject.toml"))
    return [core, *others, *contract, *examples]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@nox.session
def lint(session: nox.Session) -> None:
    """Lint and format-check the whole workspace with ruff (config in the root pyproject.toml)."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Run mypy --strict on each distribution's src/ (and the policy scripts), each installed editable."""
    # The otel extra's API: mayfly.telemetry.otel is type-checked against it.
    session.install("mypy>=1.10", "pytest>=8", "packaging>=24", "opentelemetry-api>=1.25,<2")
    dists = _distributions()
    for dist in dists:
        session.install("-e", _rel(dist))
    for dist in dists:
        src = dist / "src"
        if src.is_dir():
            session.run("mypy", "--strict", _rel(src))
    session.run(
        "mypy",
        "--strict",
        "policy/check_runtime_dependencies.py",
        "policy/check_isolation.py",
        "policy/asyncio_tripwire.py",
    )


@nox.session
def audit(session: nox.Session) -> None:
    """Runtime-dependency audit (ADR-0033) on every target, then the auditor's own tests."""
    session.install("pytest>=8", "packaging>=24")
    session.run("python", "policy/check_runtime_dependencies.py", "--all-targets")
    session.run("pytest", "-p", "asyncio_tripwire", "policy/tests", *session.posargs, env=TRIPWIRE_ENV)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the docs with warnings as errors into docs/_build/html, then execute every docs example."""
    for dist in _distributions():
        session.install("-e", _rel(dist))
    # docs/telemetry.md's console-exporter example runs on the OpenTelemetry SDK (it pulls the API).
    session.install("-r", "docs/requirements.txt", "pytest>=8", "opentelemetry-sdk>=1.25,<2")
    session.run(
        "sphinx-build",
        "--fail-on-warning",
        "--keep-going",
        "--builder",
        "html",
        "docs",
        "docs/_build/html",
    )
    session.run("pytest", "-p", "asyncio_tripwire", "docs/tests", *session.posargs, env=TRIPWIRE_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """Run every packages/*/benchmarks/bench_*.py script and write one report to .benchmarks/report.txt.

    ``nox -s bench -- --quick`` passes ``--quick`` to the scripts that have a
    quick path (smaller sizes or fewer repeats; each script's ``--help`` says
    what it skips) and runs the others in full; any other argument after
    ``--`` goes to every script. Each section of the report names the
    script's wall time and the load average before and after it
    (docs/performance.md, "Running every benchmark").
    """
    scripts = sorted(ROOT.glob("packages/*/benchmarks/bench_*.py"))
    if not scripts:
        session.error("no benchmark scripts match packages/*/benchmarks/bench_*.py")
    for dist in _distributions():
        session.install("-e", _rel(dist))
    quick = "--quick" in session.posargs
    common = [arg for arg in session.posargs if arg != "--quick"]
    sections = []
    started = time.perf_counter()
    for script in scripts:
        args = [
            *common,
            *(["--quick"] if quick and '"--quick"' in script.read_text(encoding="utf-8") else []),
        ]
        session.log(f"benchmark {_rel(script)} {' '.join(args)}".rstrip())
        before, began = os.getloadavg()[0], time.perf_counter()
        output = session.run("python", _rel(script), *args, silent=True)
        header = (
            f"=== {_rel(script)} {' '.join(args)}".rstrip()
            + f" === {time.perf_counter() - began:.0f} s, load {before:.2f} -> {os.getloadavg()[0]:.2f}"
        )
        sections.append(f"{header}\n{str(output).rstrip()}\n")
    report = "\n".join(sections)
    took = time.perf_counter() - started
    report += f"\n{len(scripts)} benchmark scripts in {took:.0f} s on {os.cpu_count()} CPUs\n"
    out = ROOT / ".benchmarks" / "report.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(report, encoding="utf-8")
    print(report)  # noqa: T201  # the report is this session's product
    session.log(f"report written to {_rel(out)} ({len(scripts)} benchmark scripts)")


@nox.session
def bench_dbos(session: nox.Session) -> None:
    """Mayfly beside DBOS Transact on the same PostgreSQL: ``nox -s bench_dbos [-- --repeat 5 ...]``.

    DBOS is banned as a dependency (it runs its own event loop and executor);
    policy/runtime-dependency-policy.toml admits it as the benchmark
    comparator of this session only, pinned, and the audit fails if it appears
    anywhere else. Each side runs in its own process; docs/performance.md,
    "Beside DBOS", says what is measured.
    """
    session.install("-e", "packages/mayfly", "-e", "packages/mayfly-postgres")
    # The comparator, in this session's venv only (policy/runtime-dependency-policy.toml, [[comparator]]).
    session.install("dbos==3.4.0")
    session.run("python", "packages/mayfly-postgres/benchmarks/dbos/bench_vs_dbos.py", *session.posargs)


SIM_BACKENDS = ("file", "lmdb", "postgres", "redis")


@nox.session
def sim(session: nox.Session) -> None:
    """Seeded simulation: ``nox -s sim -- --backend B --seeds N [--seed S] [--workers K]`` (default 1,000).

    Without ``--backend`` every durable backend runs in turn (PostgreSQL and
    Redis on loopback). Each run prints its seeds per second and, last,
    ``N seeds, V violations``; a failing seed prints its reproduce command.
    """
    for dist in _distributions():
        session.install("-e", _rel(dist))
    args = list(session.posargs)
    if "--seeds" not in args and "--seed" not in args:
        args += ["--seeds", "1000"]
    if "--backend" in args:
        session.run("python", "-m", "mayfly_contract.sim", *args)
        return
    for backend in SIM_BACKENDS:
        session.run("python", "-m", "mayfly_contract.sim", "--backend", backend, *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Run every isolated tox env (the README's test command); pass tox arguments after --."""
    session.install("tox>=4.20")
    session.run("tox", "run", *session.posargs)
