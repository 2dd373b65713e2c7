"""What a seed family gets (:class:`SeedContext`) and returns (:class:`SeedResult`); the backends."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.ids import DeterministicIdSource
from mayfly.plugins import open_journal, open_leases
from mayfly.testing import (
    EffectLog,
    ExpectedRun,
    GeneratedWorkflow,
    MemoryJournal,
    MemoryLeaseStore,
    MemoryStore,
    SimDriver,
    Violation,
    drop_store,
    expected_of,
    sim_registry,
)

__all__ = ["BACKENDS", "Backend", "Reference", "SeedContext", "SeedResult", "open_backend"]

BACKENDS: Final = ("memory", "file", "lmdb", "postgres", "redis")
DEFAULT_POSTGRES: Final = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379/0?durability=memory"
SIM_SCHEMA: Final = f"sim_campaign_{os.getpid()}"
"""The PostgreSQL schema of this process's campaign (one per process, so campaigns never share one)."""
SIM_PREFIX: Final = f"sim.campaign.{os.getpid()}"
"""The Redis key prefix of this process's campaign."""


class Backend:
    """One backend for a campaign: a fresh namespace (URL) per seed, opened as a restarted process would.

    ``memory``, ``file`` and ``lmdb`` give every seed its own store;
    ``postgres`` and ``redis`` share one schema / key prefix for the whole
    campaign (``sim_campaign_<pid>`` / ``sim.campaign.<pid>`` unless the URL
    names one; cleared when it starts, dropped when it ends), and seeds stay
    apart through their run ids (each seed's ids have their own namespace).
    """

    def __init__(self, name: str, *, url: str | None = None, directory: Path | None = None) -> None:
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
        self.name = name
        self._own_dir = directory is None
        self.directory = (
            directory if directory is not None else Path(tempfile.mkdtemp(prefix=f"mayfly-sim-{name}-"))
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        if name == "postgres":
            base = url or os.environ.get("MAYFLY_TEST_POSTGRES_URL") or DEFAULT_POSTGRES
            self.shared_url = (
                base if "schema=" in base else f"{base}{'&' if '?' in base else '?'}schema={SIM_SCHEMA}"
            )
        elif name == "redis":
            base = url or os.environ.get("MAYFLY_REDIS_MEMORY_URL") or DEFAULT_REDIS
            self.shared_url = (
                base if "prefix=" in base else f"{base}{'&' if '?' in base else '?'}prefix={SIM_PREFIX}"
            )
        else:
            self.shared_url = ""
        self._memory: list[str] = []
        self.clear()

    @property
    def durable(self) -> bool:
        """Whether the store outlives the process (every backend but ``memory``)."""
        return self.name != "memory"

    @property
    def has_files(self) -> bool:
        """Whether the store is files this process can damage (``file`` and ``lmdb``)."""
        return self.name in ("file", "lmdb")

    def url(self, seed: int, slot: int = 0) -> str:
        """The store URL of ``seed``'s ``slot`` (a fresh, empty store for file, LMDB and memory)."""
        if self.name == "memory":
            store = MemoryStore(f"sim-{seed}-{slot}")
            self._memory.append(store.name)
            return store.url
        if self.name in ("file", "lmdb"):
            path = self.path(seed, slot)
            if path.exists():
                shutil.rmtree(path)
            # durability=write for file: with fsync the local lease is taken on an offload thread, and a
            # death simulated in this process (unlike a real one) cannot stop that thread, which would then
            # hold an orphaned flock. The real-SIGKILL subset runs the fsync mode.
            return f"file://{path}?durability=write" if self.name == "file" else f"lmdb://{path}"
        return self.shared_url

    def path(self, seed: int, slot: int = 0) -> Path:
        """The directory of a file or LMDB store."""
        return self.directory / f"seed-{seed}-{slot}"

    def open(self, url: str) -> tuple[WorkflowJournal, RecoveryLeaseStore]:
        """Open the journal and lease store at ``url``, as a freshly started process does."""
        if self.name == "memory":
            return MemoryJournal(url), MemoryLeaseStore(url)
        return open_journal(url), open_leases(url)

    def opener(self, url: str) -> Callable[[], tuple[WorkflowJournal, RecoveryLeaseStore]]:
        """A callable opening ``url`` afresh each time (a :class:`~mayfly.testing.SimDriver` opener)."""
        return lambda: self.open(url)

    def bury(self, owner: str) -> None:
        """Finish a simulated death on PostgreSQL as a real one ends: its sessions gone, its leases expired.

        A killed process's sockets close, so the server aborts what its
        sessions were in the middle of and frees their row locks; a process
        abandoned in this one keeps its sockets open, so its sessions (every
        session of the campaign's schema: at a death no other process uses
        it) are terminated here. A grant the death left with no guard (an
        acquire in flight on another task) expires, as the TTL of a dead
        owner's lease runs out during the downtime. On Redis (whose commands
        are atomic, so no session holds anything) only such grants expire.
        Elsewhere the driver releases every grant it saw.
        """
        if self.name == "redis":
            self._expire_redis_leases(owner)
            return
        if self.name != "postgres":
            return
        import psycopg  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only with the backend
        from psycopg import sql  # noqa: PLC0415

        from mayfly_postgres._url import parse_url  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        settings = parse_url(self.shared_url)
        with psycopg.Connection.connect(settings.conninfo, autocommit=True) as connection:
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database() AND position(%s in query) > 0",
                (f'"{settings.schema}".',),
            )
            connection.execute(
                sql.SQL("UPDATE {} SET expires_at = '-infinity' WHERE owner = %s").format(
                    sql.Identifier(settings.schema, "leases")
                ),
                (owner,),
            )

    def _expire_redis_leases(self, owner: str) -> None:
        import redis  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only with the backend

        from mayfly_redis._url import parse_url  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        target = parse_url(self.shared_url)
        client = redis.Redis(host=target.host, port=target.port, db=target.db)
        try:
            for key in client.scan_iter(match=f"{target.prefix}:*:lease", count=1000):
                value = client.get(key)  # "<token> <nonce> <owner>"
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
                if value is not None and text.split(" ", 2)[-1] == owner:
                    client.delete(key)
        finally:
            client.close()

    def release(self, seed: int) -> None:
        """Forget a finished seed's private stores."""
        for name in self._memory:
            drop_store(name)
        self._memory.clear()
        if self.name in ("file", "lmdb"):
            for path in self.directory.glob(f"seed-{seed}-*"):
                shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> None:
        """Empty the shared PostgreSQL schema or Redis prefix (file, LMDB and memory stores are per seed)."""
        if self.name == "postgres":
            from mayfly_postgres.__main__ import _run  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only with the backend

            _run("drop", self.shared_url)  # `python -m mayfly_postgres drop --yes URL`, without its output
        elif self.name == "redis":
            import redis  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only with the backend

            from mayfly_redis._url import parse_url  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

            target = parse_url(self.shared_url)
            client = redis.Redis(host=target.host, port=target.port, db=target.db)
            try:
                keys = list(client.scan_iter(match=f"{target.prefix}:*", count=1000))
                for start in range(0, len(keys), 500):
                    client.delete(*keys[start : start + 500])
            finally:
                client.close()

    def close(self) -> None:
        """Clear the shared namespace and remove the campaign's directory."""
        self.clear()
        for name in self._memory:
            drop_store(name)
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


def open_backend(name: str, *, url: str | None = None, directory: Path | None = None) -> Backend:
    """The :class:`Backend` called ``name`` (``memory``, ``file``, ``lmdb``, ``postgres`` or ``redis``)."""
    return Backend(name, url=url, directory=directory)


@dataclass(frozen=True)
class Reference:
    """A generated workflow's fault-free run: its result, and the operations and invocations it took."""

    expected: ExpectedRun
    operations: int
    invocations: int


@dataclass
class SeedContext:
    """Everything a seed family needs: the seed, its own random stream, the backend, the worker count."""

    seed: int
    backend: Backend
    workers: int = 1
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def namespace(self) -> int:
        """The seed's id namespace (its run ids never collide with another seed's on a shared store)."""
        return self.seed % (1 << 32)

    def ids(self) -> DeterministicIdSource:
        """A fresh id source of the seed's namespace (the same ids on every replay of the seed)."""
        return DeterministicIdSource(self.namespace)

    def reference(self, workflow: GeneratedWorkflow) -> Reference:
        """Run ``workflow`` fault-free on a private memory store: the result every faulty run must equal."""
        store = MemoryStore()
        effects = EffectLog()
        driver = SimDriver(
            lambda: (MemoryJournal(store.url), MemoryLeaseStore(store.url)),
            sim_registry(effects),
            effects=effects,
            ids=self.ids(),
        )
        try:
            run_id = driver.ids.new_id()
            result = driver.run(workflow.spec, workflow.input, run_id, workflow.events)
            return Reference(expected_of(result), driver.plan.operations, effects.invocation_count())
        finally:
            driver.close()
            drop_store(store.name)


@dataclass
class SeedResult:
    """What one seed found: its family, its violations (none: the seed passed), and what it exercised."""

    family: str
    violations: list[Violation] = field(default_factory=list)
    failed_closed: int = 0
    """Typed errors that correctly refused damaged or fenced state (passes, not violations)."""
    notes: list[str] = field(default_factory=list)
