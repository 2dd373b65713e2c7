"""`mayfly` on an LMDB journal, as a user runs it: a lease-held refusal says when the lease expires."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mayfly.runtime import WorkflowRuntime


def mayfly(tmp_path: Path, *args: str, code: int) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mayfly ARGS`` in ``tmp_path`` and check its exit code."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "MAYFLY_JOURNAL")}
    done = subprocess.run(
        [sys.executable, "-m", "mayfly", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


def test_a_lease_held_refusal_says_who_holds_it_and_when_it_expires(tmp_path: Path) -> None:
    """On LMDB (expiring leases) exit 4 names the holder and says the lease expires in N s unless renewed."""
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"workflow_id": "cli.q", "version": 1, "nodes": [{"id": "a", "handler": "a@1"}]})
    )
    url = f"lmdb://{tmp_path}/env"
    run_id = mayfly(tmp_path, "--journal", url, "-q", "submit", str(spec), code=0).stdout.strip()
    with WorkflowRuntime(url).leases.acquire(run_id, "ops-console", 90_000):
        refused = mayfly(tmp_path, "--journal", url, "cancel", run_id, "--reason", "x", code=4)
    assert "its recovery lease is held by ops-console" in refused.stderr
    expires = re.search(r"it expires in (\d+\.\d) s unless its holder renews it", refused.stderr)
    assert expires is not None and 0 < float(expires.group(1)) <= 90, refused.stderr
    assert refused.stderr.count("\n") == 1
