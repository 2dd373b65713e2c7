"""Connections: psycopg waits parked on the greenlet hub, a small per-thread pool, retries and error mapping.

psycopg 3 sync connections route every network wait of a query through
``Connection.wait``. :class:`HubConnection` overrides it: inside a hub task
the wait parks on the hub (``wait_fd``), so timers and other tasks keep
running while a query is on the network; outside a hub it is psycopg's own
blocking wait. Connecting happens rarely and goes through ``offload``.

One connection serves one caller at a time (ARCHITECTURE §7: one connection
per greenlet). The pool keeps idle connections per thread, so no lock is ever
held across a greenlet switch and no thread is started here; when a thread's
connections are all busy, hub tasks park on a substrate ``Event`` until one
comes back.
"""

from __future__ import annotations

import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from mayfly.errors import JournalUnavailable, SubstrateError
from mayfly.substrate import Event, current_task, offload, sleep, wait_fd
from mayfly_postgres._url import PostgresSettings

__all__ = ["ConnectionPool", "HubConnection", "is_transient", "pause", "unavailable"]

T = TypeVar("T")
RV = TypeVar("RV")

_READY_NONE: Final = 0
_READY_R: Final = 1  # psycopg's Ready.R and Ready.W, the hub's EVENT_READ and EVENT_WRITE
_READY_W: Final = 2
_POLL_EVENTS: Final = {1: select.POLLIN, 2: select.POLLOUT, 3: select.POLLIN | select.POLLOUT}
# SQLSTATEs worth retrying on a fresh connection: connection exceptions (08),
# server shutdown or startup (57P01-57P03), too many connections, the
# serialization/deadlock classes, and a read-only server (25006: a demoted
# primary; reconnecting with target_session_attrs=read-write finds the new one).
_TRANSIENT_STATES: Final = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01", "25006"})
# A vanished client (its host cut off by a partition) is noticed by the server, which ends its session
# within about 8 s, and with it a transaction left open mid-pipeline (an indexed append waits on the client
# between its statement and its Sync): the run's row locks do not outlive the partition. The URL's own
# options come later and may override these.
_DEAD_CLIENT_OPTIONS: Final = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3 -c tcp_user_timeout=8000"
)
# libpq reports a refused login without a SQLSTATE; these texts mean retrying cannot help.
_PERMANENT_LOGIN: Final = (
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "password",
)


def in_hub_task() -> bool:
    """Whether the caller is a task of a running hub (and may park on it)."""
    try:
        current_task()
    except SubstrateError:  # HubNotRunning is a SubstrateError too
        return False
    return True


def pause(seconds: float) -> None:
    """Wait ``seconds`` without blocking the hub: parked in a hub task, ``time.sleep`` elsewhere."""
    if in_hub_task():
        sleep(seconds)
    else:
        time.sleep(seconds)


class HubConnection(psycopg.Connection[tuple[Any, ...]]):
    """A psycopg connection whose waits park on the greenlet hub while ``cooperative`` is set."""

    cooperative: bool = False
    _poller: Any = None  # select.poll of this connection's socket, made on its first cooperative wait
    _polled = -1  # the descriptor it watches
    wire_prepared: set[bytes] | None = None
    """The names of the statements prepared on this session by :mod:`mayfly_postgres._wire`."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        """Consume a psycopg generator, parking the hub task on the socket between its steps.

        Most of psycopg's waits find the socket ready already (writable to
        send a query, or a reply that came in with the previous read): one
        ``poll(2)`` that does not wait answers them, where parking costs a
        selector registration and two task switches (about six waits of eight
        per appended node). Only a wait that nothing answers yet parks.
        """
        if not self.cooperative:
            return super().wait(gen, interval, timeout)
        fileno = self.pgconn.socket
        poller = self._poller
        if poller is None or self._polled != fileno:
            poller = self._poller = select.poll()
            poller.register(fileno, 0)
            self._polled = fileno
        try:
            state = next(gen)
            while True:
                poller.modify(fileno, _POLL_EVENTS[state])
                found = poller.poll(0)
                if found:
                    events = found[0][1]
                    # As psycopg's own poll wait reads them: anything but writable means read (an error or
                    # a hang-up is read as one), anything but readable means write.
                    ready = (_READY_R if events & ~select.POLLOUT else 0) | (
                        _READY_W if events & ~select.POLLIN else 0
                    )
                else:
                    # No timeout: psycopg's interval only polls for Ctrl-C, which a hub does not need.
                    ready = wait_fd(fileno, state, timeout)
                state = gen.send(ready)
        except StopIteration as done:
            return done.value


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` may go away on a fresh connection (lost server, restart, overload)."""
    if isinstance(error, pg_errors.ConnectionTimeout | psycopg.InterfaceError):
        return True
    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate
    if state is None:
        # No SQLSTATE: the client could not reach the server, lost the socket, or its login was refused.
        text = str(error)
        refused = "FATAL:" in text and any(reason in text for reason in _PERMANENT_LOGIN)
        return isinstance(error, psycopg.OperationalError) and not refused
    return state.startswith("08") or state in _TRANSIENT_STATES


def first_line(error: BaseException) -> str:
    """The first line of an error's text (driver messages span several lines)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def unavailable(url: str, doing: str, error: BaseException) -> JournalUnavailable:
    """Map a driver error to ``JournalUnavailable`` with one line saying what failed and what to do."""
    state = getattr(error, "sqlstate", None)
    code = f" [SQLSTATE {state}]" if state else ""
    return JournalUnavailable(
        f"{url}: {doing} failed: {first_line(error)}{code}; check that the server is reachable "
        "and the role has the permissions listed in docs/backends/postgres.md"
    )


class _ThreadSlot:
    """The idle connections, open count and parked hub tasks of one thread."""

    __slots__ = ("idle", "open", "waiters")

    def __init__(self) -> None:
        self.idle: list[HubConnection] = []
        self.open = 0
        self.waiters: deque[Event] = deque()


class ConnectionPool:
    """Hands out one connection per caller; per-thread idle lists, no threads, no cross-thread waits."""

    def __init__(self, settings: PostgresSettings) -> None:
        self._settings = settings
        self._local = threading.local()
        self._registry_lock = threading.Lock()
        self._all: set[HubConnection] = set()
        self._closed = False

    @property
    def settings(self) -> PostgresSettings:
        """The parsed URL this pool connects with."""
        return self._settings

    def _slot(self) -> _ThreadSlot:
        slot: _ThreadSlot | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = _ThreadSlot()
            self._local.slot = slot
        return slot

    def _connect(self) -> HubConnection:
        settings = self._settings
        connection = HubConnection.connect(
            settings.conninfo,
            autocommit=True,
            # Part of the startup packet: no extra round trip, and no role default can weaken it.
            options=f"{_DEAD_CLIENT_OPTIONS} {settings.startup_options}",
        )
        with self._registry_lock:
            if self._closed:
                connection.close()
                raise JournalUnavailable(f"{settings.url}: the journal is closed")
            self._all.add(connection)
        return connection

    def _checkout(self, cooperative: bool) -> HubConnection:
        if self._closed:
            raise JournalUnavailable(f"{self._settings.url}: the journal is closed; open it again")
        slot = self._slot()
        while True:
            while slot.idle:
                connection = slot.idle.pop()
                if not connection.closed:
                    return connection
                self._forget(slot, connection)
            if slot.open < self._settings.pool_size or not cooperative:
                # Outside a hub a thread has one caller at a time; it never waits for itself.
                slot.open += 1
                try:
                    return offload(self._connect) if cooperative else self._connect()
                except BaseException:
                    slot.open -= 1
                    self._wake(slot)
                    raise
            event = Event()
            slot.waiters.append(event)
            try:
                event.wait()
            except BaseException:
                # Cancelled while parked: leave the queue, and pass on a wake that was meant for us.
                if event in slot.waiters:
                    slot.waiters.remove(event)
                elif event.is_set():
                    self._wake(slot)
                raise

    def _wake(self, slot: _ThreadSlot) -> None:
        if slot.waiters:
            slot.waiters.popleft().set()

    def _forget(self, slot: _ThreadSlot, connection: HubConnection) -> None:
        slot.open -= 1
        with self._registry_lock:
            self._all.discard(connection)
        connection.close()

    @contextmanager
    def connection(self) -> Iterator[HubConnection]:
        """Lend a connection for one operation; a broken or mid-transaction one is closed, not reused."""
        cooperative = in_hub_task()
        connection = self._checkout(cooperative)
        connection.cooperative = cooperative
        slot = self._slot()
        discard = False
        try:
            yield connection
        except BaseException as error:
            # A transient failure is retried on a fresh connection, never on this one.
            discard = is_transient(error)
            raise
        finally:
            connection.cooperative = False
            reusable = (
                not discard
                and not self._closed
                and not connection.closed
                and not connection.broken
                and connection.info.transaction_status == TransactionStatus.IDLE
            )
            if reusable:
                slot.idle.append(connection)
            else:
                self._forget(slot, connection)
            self._wake(slot)

    def retrying(self, doing: str, operation: Callable[[HubConnection], T]) -> T:
        """Run an idempotent ``operation`` on a pooled connection, retrying transient failures.

        Retries last at most the URL's ``reconnect_timeout``; then, or on a
        permanent driver error, raises ``JournalUnavailable`` naming ``doing``.
        """
        deadline = time.monotonic() + self._settings.reconnect_timeout
        delay = 0.05
        while True:
            try:
                with self.connection() as connection:
                    return operation(connection)
            except psycopg.Error as error:
                if not is_transient(error) or time.monotonic() + delay > deadline or self._closed:
                    raise unavailable(self._settings.url, doing, error) from None
            pause(delay)
            delay = min(delay * 2, 1.0)

    def close(self) -> None:
        """Close every connection of every thread; later checkouts raise ``JournalUnavailable``."""
        with self._registry_lock:
            self._closed = True
            connections, self._all = self._all, set()
        for connection in connections:
            connection.close()
