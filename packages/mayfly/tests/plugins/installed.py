"""Install the test plugin distributions of ``dists/`` into a test environment, through their entry points.

Each distribution is a real project (a ``pyproject.toml`` publishing its
module in the ``mayfly`` entry-point group). :func:`build_wheel` packs one as
a pure-Python wheel with the standard library alone, so the tests need no
build backend and no network; pip then installs the wheel into a fresh site
directory (``pip install --target``), and the commands under test run in
subprocesses with that directory on ``PYTHONPATH``. Mayfly finds the plugins
exactly as it finds any installed plugin: through ``importlib.metadata``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import msgspec

from mayfly.commit import seal_events
from mayfly.journal import JournalRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.testing import ReducerHarness

DISTS = Path(__file__).resolve().parent / "dists"
FUTURE_MAYFLY = Path(__file__).resolve().parent / "future_mayfly.py"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(project: Path, out: Path) -> Path:
    """Pack the ``src/`` packages, metadata and entry points of ``project`` as a ``py3-none-any`` wheel."""
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name, version = meta["name"], meta["version"]
    stem = f"{name.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    files: dict[str, bytes] = {}
    for source in sorted((project / "src").rglob("*.py")):
        files[source.relative_to(project / "src").as_posix()] = source.read_bytes()
    requires = "".join(f"Requires-Dist: {dependency}\n" for dependency in meta.get("dependencies", ()))
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {meta['description']}\n"
        f"Requires-Python: {meta['requires-python']}\n{requires}"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: mayfly-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    groups = meta.get("entry-points", {})
    files[f"{dist_info}/entry_points.txt"] = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items()) + "\n"
        for group, points in groups.items()
    ).encode()
    record = [_record_line(path, data) for path, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def install(site: Path, *projects: str) -> Path:
    """Install the named ``dists/`` projects into the site directory ``site`` with pip; return ``site``."""
    wheels = [str(build_wheel(DISTS / project, site.parent / "wheels")) for project in projects]
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    subprocess.run(
        [*pip, "--target", str(site), *wheels],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        timeout=300,
    )
    return site


def environment(site: Path | None, journal: str) -> dict[str, str]:
    """The environment of a process in the test environment ``site`` (none: the bare core)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAYFLY_PLUGINS", "MAYFLY_DISABLE_PLUGINS"}}
    env.pop("PYTHONPATH", None)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env["MAYFLY_JOURNAL"] = journal
    return env


def run(
    site: Path | None, journal: str, *args: str, cwd: Path, future: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``mayfly ARGS`` (or ``python ARGS`` when ``args[0]`` ends in ``.py``) in the test environment.

    With ``future``, the process is a Mayfly that writes ``NodeReady`` at
    schema version 2 (``future_mayfly.py``), the release an upcaster is for.
    """
    script = args[0].endswith(".py")
    if future:
        command = [sys.executable, str(FUTURE_MAYFLY), *(("--script",) if script else ()), *args]
    elif script:
        command = [sys.executable, *args]
    else:
        command = [sys.executable, "-m", "mayfly", *args]
    return subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        env=environment(site, journal),
        cwd=cwd,
        timeout=120,
    )


def v1_fixture(journal_url: str) -> str:
    """A run written by a Mayfly whose NodeReady v1 named its node ``node``: a then b, b ready."""
    spec = WorkflowSpec(
        workflow_id="acme.legacy",
        version=1,
        nodes=(Node("a", handler="a@1"), Node("b", handler="b@1", depends_on=("a",))),
    )
    harness = ReducerHarness(spec, ids=DeterministicIdSource(namespace=21))
    harness.start("a")
    harness.complete("a", Succeeded(output={"a": 1}))
    records = []
    for record in seal_events(harness.run_id, 1, harness.history, DeterministicIdSource(namespace=22)):
        if record.event_type == "NodeReady":
            body = msgspec.json.decode(record.payload)
            legacy = {"type": "NodeReady", "node": body["node_id"], "cause": body["cause"]}
            sealed = JournalRecord.seal(
                run_id=record.run_id,
                sequence=record.sequence,
                event_id=record.event_id,
                event_type="NodeReady",
                schema_version=1,
                payload=msgspec.json.encode(legacy),
            )
            records.append(sealed)
            continue
        records.append(record)
    journal = LocalWorkflowJournal(journal_url)
    journal.append(harness.run_id, 1, records)
    journal.close()
    return harness.run_id
