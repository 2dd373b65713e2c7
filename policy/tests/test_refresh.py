"""``--refresh`` against a real HTTP index on loopback serving a synthetic PEP 691 project set."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import check_runtime_dependencies as audit
import pytest

REAL_POLICY = Path(audit.__file__).resolve().parent / "runtime-dependency-policy.toml"


def wheel(name: str, version: str, requires: list[str], padding: int = 0) -> bytes:
    """Build a wheel whose METADATA lists ``requires``, after ``padding`` bytes of incompressible code."""
    buf = io.BytesIO()
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(buf, "w") as zf:
        if padding:
            zf.writestr(f"{name.replace('-', '_')}/_blob.bin", os.urandom(padding))
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return buf.getvalue()


class Index:
    """Routes of a tiny package index: simple JSON pages, wheel files and .metadata files."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.projects: dict[str, list[dict[str, object]]] = {}
        self.base = ""
        self.sizes = True  # publish file sizes (PEP 700), which enables range reads
        self.bytes_served: dict[str, int] = {}

    def add(
        self,
        name: str,
        version: str,
        requires: list[str],
        *,
        requires_python: str | None = None,
        yanked: bool = False,
        core_metadata: bool = False,
        padding: int = 0,
    ) -> None:
        """Publish one release as a py3-none-any wheel."""
        filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        data = wheel(name, version, requires, padding)
        self.routes[f"/files/{filename}"] = data
        entry: dict[str, object] = {
            "filename": filename,
            "url": f"{self.base}/files/{filename}",
            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            "requires-python": requires_python,
            "yanked": yanked,
        }
        if self.sizes:
            entry["size"] = len(data)
        if core_metadata:
            entry["core-metadata"] = True
            meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
            self.routes[f"/files/{filename}.metadata"] = meta.encode()
            self.routes[f"/files/{filename}"] = b"not a zip: the .metadata file must be used"
        self.projects.setdefault(name, []).append(entry)
        self.routes[f"/simple/{name}/"] = json.dumps(
            {"meta": {"api-version": "1.1"}, "name": name, "files": self.projects[name]}
        ).encode()


@pytest.fixture
def index() -> Iterator[Index]:
    """A real HTTP server on 127.0.0.1 serving an Index; stopped after the test."""
    idx = Index()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = idx.routes.get(self.path)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            wanted = self.headers.get("Range")
            if wanted:
                first, last = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
                body = body[first : last + 1]
                self.send_response(206)
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            idx.bytes_served[self.path] = idx.bytes_served.get(self.path, 0) + len(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    idx.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield idx
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def make_repo(
    root: Path, deps: list[str], requires_python: str = ">=3.11.3", pythons: str | None = None
) -> None:
    """A repository with one distribution and the real policy (minus the tooling list, ``pythons`` if given).

    The policy's benchmark comparators are dropped too: they name a nox session this repository lacks.
    """
    (root / "policy").mkdir()
    text = REAL_POLICY.read_text(encoding="utf-8")
    text = text.replace('requirements = ["tox>=4.20", "nox>=2024.4"]', "requirements = []")
    text = re.sub(r"^\[\[comparator\]\]\n.*?(?=^# ---)", "", text, flags=re.MULTILINE | re.DOTALL)
    if pythons is not None:
        line = next(x for x in text.splitlines() if x.startswith("python_versions = "))
        text = text.replace(line, f"python_versions = {pythons}")
    (root / audit.POLICY_FILE).write_text(text, encoding="utf-8")
    (root / "packages" / "mayfly").mkdir(parents=True)
    (root / "packages" / "mayfly" / "pyproject.toml").write_text(
        f'[project]\nname = "mayfly"\nversion = "1.0"\nrequires-python = "{requires_python}"\n'
        f"dependencies = {json.dumps(deps)}\n",
        encoding="utf-8",
    )


def test_refresh_resolves_per_python_and_the_audit_uses_the_lock(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refresh picks, per Python, the newest non-yanked final release that installs there, then audits it."""
    index.add("foo", "1.0", ["trio>=0.20"])
    index.add("foo", "2.0", ["msgspec"], requires_python=">=3.12")
    index.add("foo", "3.0", ["curio"], yanked=True)
    index.add("foo", "4.0rc1", ["curio"])
    index.add("trio", "0.27.0", [])
    index.add("msgspec", "0.23.0", ['tomli; python_version < "3.11"'], core_metadata=True)
    make_repo(tmp_path, ["foo>=1"])
    code = audit.main(["--root", str(tmp_path), "--refresh", "--index", index.base])
    out = capsys.readouterr().out
    assert code == 1
    assert "lock refreshed: 4 third-party distribution versions" in out
    line = next(x for x in out.splitlines() if x.startswith("FORBIDDEN"))
    assert line.startswith("FORBIDDEN mayfly 1.0 -> foo 1.0 -> trio 0.27.0  (on py3.11:")
    lock = json.loads((tmp_path / audit.LOCK_FILE).read_text(encoding="utf-8"))
    assert lock["resolutions"]["foo"][">=1"] == {"3.11": "1.0", "3.12": "2.0", "3.13": "2.0", "3.14": "2.0"}
    assert lock["distributions"]["msgspec"]["0.23.0"]["requires_dist"] == ['tomli; python_version < "3.11"']
    assert "tomli" not in lock["distributions"]
    # The normal run reads only the lock and reaches the same verdict offline.
    assert audit.main(["--root", str(tmp_path)]) == 1


def test_refresh_reads_requires_python_at_the_audited_floor(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release installable only below the 3.11.3 floor is never chosen, and the lock records the floors."""
    index.add("foo", "1.0", [])
    index.add("foo", "2.0", ["trio>=0.20"], requires_python=">=3.8,<3.11.3")
    index.add("trio", "0.27.0", [])
    make_repo(tmp_path, ["foo>=1"], ">=3.11.3", '["3.11.3", "3.12", "3.13", "3.14"]')
    code = audit.main(["--root", str(tmp_path), "--refresh", "--index", index.base])
    out = capsys.readouterr().out
    assert code == 0, out
    lock = json.loads((tmp_path / audit.LOCK_FILE).read_text(encoding="utf-8"))
    assert lock["resolutions"]["foo"][">=1"] == {"3.11": "1.0", "3.12": "1.0", "3.13": "1.0", "3.14": "1.0"}
    assert lock["python_versions"] == ["3.11.3", "3.12.0", "3.13.0", "3.14.0"]
    assert "trio" not in lock["distributions"]


def test_refresh_fails_closed_on_an_unknown_project(index: Index, tmp_path: Path) -> None:
    """A requirement the index does not know is a usage error naming the URL, and no lock is written."""
    make_repo(tmp_path, ["does-not-exist"])
    code = audit.main(["--root", str(tmp_path), "--refresh", "--index", index.base])
    assert code == 2
    assert not (tmp_path / audit.LOCK_FILE).exists()


def test_refresh_reads_wheel_metadata_with_range_requests(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A large wheel's METADATA is read by fetching its tail and one member, not the whole file."""
    index.add("big", "1.0", ["gevent"], padding=400_000)
    index.add("gevent", "24.2.1", [])
    make_repo(tmp_path, ["big"])
    code = audit.main(["--root", str(tmp_path), "--refresh", "--index", index.base])
    assert code == 1
    assert "FORBIDDEN mayfly 1.0 -> big 1.0 -> gevent 24.2.1" in capsys.readouterr().out
    path = "/files/big-1.0-py3-none-any.whl"
    assert 0 < index.bytes_served[path] < len(index.routes[path]) // 4


def test_refresh_downloads_the_wheel_when_the_index_gives_no_size(
    index: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without file sizes the whole wheel is fetched once and its METADATA read."""
    index.sizes = False
    index.add("big", "1.0", ["eventlet"], padding=50_000)
    index.add("eventlet", "0.36.1", [])
    make_repo(tmp_path, ["big"])
    code = audit.main(["--root", str(tmp_path), "--refresh", "--index", index.base])
    assert code == 1
    assert "FORBIDDEN mayfly 1.0 -> big 1.0 -> eventlet 0.36.1" in capsys.readouterr().out
    path = "/files/big-1.0-py3-none-any.whl"
    assert index.bytes_served[path] == len(index.routes[path])
