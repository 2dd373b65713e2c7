"""A claiming process for run index tests: ``python claimant.py URL OWNER``.

Prints ``ready``, waits for ``go`` on stdin, then claims in small random
batches (leases of an hour, never released) until three claims in a row find
nothing, and prints one JSON line: the ``[run id, fencing token]`` pairs it got.
"""

from __future__ import annotations

import json
import random
import sys
import time

from mayfly_postgres import PostgresJournal


def main(url: str, owner: str) -> None:
    """Claim until nothing is left; report every grant."""
    journal = PostgresJournal(url)
    rng = random.Random(owner)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    got: list[tuple[str, int]] = []
    empty = 0
    while empty < 3:
        guards = journal.claim(
            owner, limit=rng.randint(1, 9), ttl_ms=3_600_000, now_ms=int(time.time() * 1000)
        )
        empty = 0 if guards else empty + 1
        got.extend((guard.run_id, guard.fencing_token) for guard in guards)
    sys.stdout.write(json.dumps(got) + "\n")
    sys.stdout.flush()
    # Exit without closing: closing would release the leases, and the test checks them held.
    sys.stdout.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
