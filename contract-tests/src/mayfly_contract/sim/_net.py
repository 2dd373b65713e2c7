"""The simulator's ``net`` family: workers reaching PostgreSQL or Redis through a fault proxy.

Per seed: 2-4 generated runs on a private, restartable server
(:mod:`mayfly_contract.sim._servers`), one or two worker processes (the
``_procs`` worker), each connected through its own
:class:`~mayfly_contract.sim._netproxy.NetProxy`. While the runs are in
progress the seed applies one to four faults, each at a seeded moment (the
store holds a seeded number of records more than before):

* ``delay``: every chunk both ways held 20-200 ms (plus jitter) for 1-2 s;
* ``drop``: a blackhole for 0.3-2 s (a worker's lease may expire meanwhile);
* ``cut``: every connection reset;
* ``ambiguous``: the next one to three client writes reach the server and
  their answers are thrown away, the connection reset (ambiguous commits);
* ``refuse``: new connections reset for 0.5-1.5 s;
* ``restart``: the server itself crashes (PostgreSQL immediate shutdown,
  Redis SIGKILL with its AOF) and starts again.

A worker may give up (a typed error after its reconnect budget); then a new
worker is started and resumes the runs. At the end every run must have its
fault-free result, and ``mayfly.testing.check_invariants`` must hold over the
store, every worker's acknowledged appends and every handler invocation
(nothing acknowledged lost, one outcome per attempt, re-invocations under the
same attempt id and idempotency key, none after a success). A worker that
exits with anything but a Mayfly error is an ``untyped_error`` violation.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import random
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from mayfly.errors import MayflyError
from mayfly.testing import Violation
from mayfly_contract.sim._context import SeedContext, SeedResult
from mayfly_contract.sim._procs import (
    FamilyResult,
    Fleet,
    Observer,
    WorkerProcess,
    fault_free,
    finish,
    interim,
    open_store,
    seed_dir,
    submit,
    verdict,
    via,
    wait_until,
    workload,
)

if TYPE_CHECKING:
    # Imported where used: ``python -m mayfly_contract.sim._netproxy`` imports this package first, and a
    # module the package already imported would run twice (runpy warns).
    from mayfly_contract.sim._netproxy import NetProxy

__all__ = ["FAULTS", "NET_BACKENDS", "net_family", "net_seed"]

NET_BACKENDS: Final = frozenset({"postgres", "redis"})
FAULTS: Final = ("delay", "drop", "cut", "ambiguous", "refuse", "restart")


def _poll(observer: Observer) -> int:
    """The store's record count, or -1 while the server is down (the parent reads it directly)."""
    try:
        return observer.poll()
    except MayflyError:
        return -1


def _typed(worker: WorkerProcess) -> bool:
    """Whether a worker that exited by itself ended on a Mayfly error (the last line of its traceback)."""
    lines = [line for line in worker.log.read_text(errors="replace").splitlines() if line.strip()]
    found = re.match(r"(mayfly[\w.]*)\.(\w+): ", lines[-1] if lines else "")
    if found is None:
        return False
    try:
        error = getattr(importlib.import_module(found.group(1)), found.group(2))
    except (ImportError, AttributeError):
        return False
    return isinstance(error, type) and issubclass(error, MayflyError)


def net_seed(seed: int, backend: str, workdir: Path | None = None) -> FamilyResult:
    """Drive the seed's runs through seeded network faults and server restarts; check the invariants."""
    began = time.monotonic()
    if backend not in ("postgres", "redis"):
        raise ValueError(f"the net family runs on postgres and redis, not {backend!r}")
    rng = random.Random(f"net-{seed}-{backend}")
    work = workload(seed)
    expected = fault_free(work)
    faults = [rng.choice(FAULTS) for _ in range(rng.randint(1, 4))]
    applied: collections.Counter[str] = collections.Counter()
    proxies: list[NetProxy] = []
    seen: collections.Counter[str] = collections.Counter()  # what the proxies did, summed
    violations: list[Violation] = []
    with seed_dir(workdir, "net", seed) as directory:
        store = open_store(backend, directory, restartable=True)
        assert store.host is not None and store.server is not None
        fleet = Fleet(store, directory, rng)
        host = store.host

        def connect() -> str:
            from mayfly_contract.sim._netproxy import NetProxy  # noqa: PLC0415 - see TYPE_CHECKING above

            proxy = NetProxy(host, seed=rng.randrange(1 << 30), workdir=directory)
            proxies.append(proxy)
            return via(store.url, proxy.port)

        fleet.connect = connect
        try:
            runs = submit(store, work)
            observer = Observer(store.url, runs)
            try:
                for _ in range(rng.randint(1, 2)):
                    fleet.start()
                for fault in faults:
                    target = max(_poll(observer), 0) + rng.randint(1, 10)
                    wait_until(lambda: _poll(observer) >= target or observer.done(), 60)  # noqa: B023
                    if observer.done():
                        break
                    _apply(fault, rng, proxies, store.server)
                    applied[fault] += 1
                    if _poll(observer) >= 0:  # the server is up: check between faults too
                        with contextlib.suppress(MayflyError):  # it went down again: the final check will do
                            interim(observer, store, runs, directory)
                    fleet.reap()
                finished = wait_until(lambda: _poll(observer) >= 0, 60) and finish(observer, fleet)
                violations = verdict(
                    store, runs, expected=expected, observer=observer, fleet=fleet, finished=finished
                )
                for worker in fleet.workers:
                    if worker.process.returncode not in (None, 0, -9) and not _typed(worker):
                        violations.append(
                            Violation("untyped_error", "", f"worker {worker.number} died: {worker.tail()}")
                        )
            finally:
                observer.close()
        finally:
            fleet.close()
            for proxy in proxies:
                with contextlib.suppress(RuntimeError, OSError):
                    seen.update(proxy.stats())
                proxy.close()
            store.cleanup()
    gave_up = len(fleet.exits)
    shown = (
        ", ".join(f"{name} {count}" for name, count in sorted(applied.items())) or "none (runs ended first)"
    )
    detail = (
        f"net {backend}: {len(runs)} runs, faults: {shown}; {len(fleet.workers)} workers started, "
        f"{gave_up} gave up; proxies: {seen['ambiguous']} ambiguous commits, {seen['cuts']} cut and "
        f"{seen['refused']} refused connections; checked {observer.checked[0]} invocations, "
        f"{observer.checked[1]} acknowledged records"
    )
    return FamilyResult(
        violations, detail, time.monotonic() - began, notes=list(fleet.exits), faults=dict(applied)
    )


def _apply(fault: str, rng: random.Random, proxies: list[NetProxy], server: object) -> None:
    """Apply one fault to every worker's proxy (or the server), and heal it again."""
    if fault == "delay":
        for proxy in proxies:
            proxy.delay(rng.randint(20, 200), rng.randint(0, 50))
        time.sleep(rng.uniform(1.0, 2.0))
    elif fault == "drop":
        for proxy in proxies:
            proxy.drop()
        time.sleep(rng.uniform(0.3, 2.0))
    elif fault == "cut":
        for proxy in proxies:
            proxy.cut()
    elif fault == "ambiguous":
        for _ in range(rng.randint(1, 3)):
            for proxy in proxies:
                proxy.cut_mid_commit()
            time.sleep(0.3)
    elif fault == "refuse":
        for proxy in proxies:
            proxy.refuse()
            proxy.cut()
        time.sleep(rng.uniform(0.5, 1.5))
    elif fault == "restart":
        server.restart()  # type: ignore[attr-defined]
    for proxy in proxies:
        proxy.heal()


def net_family(ctx: SeedContext) -> SeedResult:
    """The ``net`` family for the campaign driver (``--family net``; postgres and redis)."""
    found = net_seed(ctx.seed, ctx.backend.name, ctx.backend.directory)
    return SeedResult(
        "net", found.violations, notes=[f"{found.detail} in {found.seconds:.1f} s", *found.notes]
    )
