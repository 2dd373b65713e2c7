"""Contract clause of the hub: a network backend's waits park on the hub, they never block it.

The backend is reopened through a loopback relay (another process) that
holds every server reply back, and an append and a read run on a hub next to
a task that sleeps in short steps. A backend whose sockets park on the hub
lets that task wake on time all through the wait; one that blocks the thread
starves it for the whole delay. Backends without sockets (``file``, ``lmdb``,
``sqlite``) declare ``network`` absent and skip the clause with that reason:
their calls are short and run inline by design.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mayfly.journal import NETWORK, WorkflowJournal
from mayfly.substrate import Hub, sleep, spawn
from mayfly_contract.support import Records, SlowRelay

DELAY_S = 0.4
"""How long the relay holds each reply back."""
TICK_S = 0.01
"""The timer that must keep firing: a task sleeping in steps of this length."""
LATE_S = 0.15
"""The most a tick may be late while the backend waits (well under the delay, well over scheduling noise)."""


def _timed_on_hub(call: Callable[[], object]) -> tuple[float, list[float]]:
    """Run ``call`` in a hub task beside a ticking task; return its duration and each tick's lateness."""
    lateness: list[float] = []
    done = False

    def ticker() -> None:
        while not done:
            started = time.monotonic()
            sleep(TICK_S)
            lateness.append(time.monotonic() - started - TICK_S)

    def main() -> float:
        nonlocal done
        task = spawn(ticker, name="contract-ticker")
        sleep(TICK_S)  # let the ticker start
        started = time.monotonic()
        try:
            call()
        finally:
            elapsed = time.monotonic() - started
            done = True
            task.join()
        return elapsed

    elapsed = Hub().run(main)
    return elapsed, lateness


@pytest.mark.clause("journal.hub.never-blocks")
@pytest.mark.capability("network")
def test_network_waits_never_block_the_hub(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """While an append and a read wait on a slow server, a 10 ms hub timer still fires on time."""
    network = NETWORK.of(mayfly_journal)
    assert network is not None
    with SlowRelay() as relay:
        relayed = network.relayed(relay.address)
        try:
            relayed.append(run_id, 1, records.batch(run_id, 1))  # connect before the relay slows down
            relay.set_delay(DELAY_S)
            for name, call in (
                ("append", lambda: relayed.append(run_id, 2, records.batch(run_id, 2, 2))),
                ("read", lambda: relayed.read(run_id)),
            ):
                before = relay.delivered()
                elapsed, lateness = _timed_on_hub(call)
                assert relay.delivered() > before and elapsed >= DELAY_S * 0.9, (
                    f"the {name} took {elapsed:.3f} s and its replies did not come through the relay: "
                    "relayed() must route every connection through relay(host, port)"
                )
                worst = max(lateness, default=elapsed)
                assert worst < LATE_S, (
                    f"the hub was blocked for {worst:.3f} s while the {name} waited {elapsed:.3f} s on the "
                    "network: socket waits must park on the hub (mayfly.substrate.wait_readable / wait_fd), "
                    "and long blocking calls must cross mayfly.substrate.offload"
                )
                assert len(lateness) >= elapsed / TICK_S / 4, (
                    f"the hub timer fired {len(lateness)} times in {elapsed:.3f} s"
                )
        finally:
            relayed.close()
    assert [r.sequence for r in mayfly_journal.read(run_id)] == [1, 2, 3]
