"""A worker process for multi-host tests: ``python -m mayfly_contract._nsworker URL OWNER TTL_MS POLL_MS N``.

A real :class:`mayfly.worker.Worker` serving until SIGTERM, with one handler,
``step@1``: it sleeps ``TEST_STEP_S`` seconds and returns which worker ran
which attempt. Events are written to stderr as JSON lines (``mayfly worker
--json`` has no lease TTL option, and the tests need short leases).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from typing import Any

from mayfly import HandlerRegistry, Succeeded
from mayfly.worker import Worker, json_log

registry = HandlerRegistry()
OWNER = sys.argv[2] if __name__ == "__main__" else "imported"


@registry.handler("step", version=1)
def step(request: Any) -> Succeeded:
    """Take TEST_STEP_S seconds; say who ran this attempt."""
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.05")))
    return Succeeded(output={"node": request.node_id, "worker": OWNER, "attempt": request.attempt})


def main(url: str, owner: str, ttl_ms: int, poll_ms: int, concurrency: int) -> int:
    """Serve until SIGTERM (SIGUSR1 dumps every thread's stack to stderr); return Worker.serve's status."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    worker = Worker(
        url,
        registry,
        owner=owner,
        lease_ttl_ms=ttl_ms,
        poll_interval_ms=poll_ms,
        concurrency=concurrency,
        grace_ms=5_000,
        log=json_log(sys.stderr),
    )
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
