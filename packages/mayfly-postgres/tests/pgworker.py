"""A worker process for run index tests: ``python pgworker.py URL OWNER LEASE_TTL_MS [POLL_MS]``.

Serves with the handlers of ``handlers_pg.py`` until SIGTERM, logging one JSON
object per event on stderr (``mayfly worker --json`` has no lease TTL option;
the restart test needs short leases so a killed worker's runs come back soon).
"""

from __future__ import annotations

import sys

from handlers_pg import registry

from mayfly.worker import Worker, json_log


def main(url: str, owner: str, ttl_ms: int, poll_ms: int) -> int:
    """Serve until SIGTERM; the exit status of ``Worker.serve``."""
    worker = Worker(
        url,
        registry,
        owner=owner,
        lease_ttl_ms=ttl_ms,
        poll_interval_ms=poll_ms,
        concurrency=32,
        grace_ms=5_000,
        log=json_log(sys.stderr),
    )
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 200))
