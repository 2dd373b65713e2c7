"""A claiming process for queue limit tests: ``python queue_claimant.py URL OWNER QUEUE SECONDS TTL_MS``.

Prints ``ready``, waits for ``go`` on stdin, then for ``SECONDS`` claims small
random batches from ``QUEUE`` with leases of ``TTL_MS`` that it never renews
or releases (each one simply expires), and prints one JSON line: the
``[run id, fencing token]`` pairs it got. Exits without closing the journal,
which would release the leases.
"""

from __future__ import annotations

import json
import random
import sys
import time

from mayfly_postgres import PostgresJournal


def main(url: str, owner: str, queue: str, seconds: float, ttl_ms: int) -> None:
    """Claim until the time is up; report every grant."""
    journal = PostgresJournal(url)
    rng = random.Random(owner)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        guards = journal.claim(
            owner, limit=rng.randint(1, 3), ttl_ms=ttl_ms, now_ms=int(time.time() * 1000), queues=[queue]
        )
        got.extend((guard.run_id, guard.fencing_token) for guard in guards)
        time.sleep(rng.random() * 0.002)
    sys.stdout.write(json.dumps(got) + "\n")
    sys.stdout.flush()
    sys.stdout.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
