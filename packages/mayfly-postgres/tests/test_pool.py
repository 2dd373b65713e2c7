"""The connection pool: hub-parked waits, per-thread limits, broken connections replaced, error mapping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgserver import with_options

from mayfly.model.errors import JournalUnavailable
from mayfly.substrate import Hub, sleep, spawn
from mayfly_postgres._pool import ConnectionPool, HubConnection, is_transient
from mayfly_postgres._url import parse_url


@pytest.fixture
def pool(url: str) -> Iterator[ConnectionPool]:
    """A pool of two connections per thread on the test server."""
    opened = ConnectionPool(parse_url(with_options(url, pool_size=2, application_name="mayfly_pool_test")))
    yield opened
    opened.close()


def test_pg_sleep_does_not_delay_a_hub_timer(pool: ConnectionPool) -> None:
    """A half-second pg_sleep in one task leaves the hub free: another task's timer ticks meanwhile."""
    events: list[str] = []

    def query() -> None:
        with pool.connection() as connection:
            events.append("query sent")
            connection.execute("SELECT pg_sleep(0.5)")
            events.append("query done")

    def ticker() -> None:
        while "query done" not in events:
            sleep(0.02)
            events.append("tick")

    def main() -> None:
        tasks = [spawn(query), spawn(ticker)]
        for task in tasks:
            task.join()

    Hub().run(main)
    during = events[events.index("query sent") + 1 : events.index("query done")]
    assert during and set(during) == {"tick"}


def test_outside_a_hub_waits_block_normally(pool: ConnectionPool) -> None:
    """Without a running hub the same pool works with psycopg's own blocking waits."""
    with pool.connection() as connection:
        assert isinstance(connection, HubConnection) and not connection.cooperative
        assert connection.execute("SELECT 41 + 1").fetchone() == (42,)


def test_tasks_beyond_the_pool_size_wait_their_turn(pool: ConnectionPool, server: str) -> None:
    """Six tasks sharing two connections all finish, and the server never sees more than two of them."""
    seen: list[int] = []

    def work() -> int:
        with pool.connection() as connection:
            connection.execute("SELECT pg_sleep(0.05)")
            row: Any = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'mayfly_pool_test'"
            ).fetchone()
            seen.append(int(row[0]))
            return connection.info.backend_pid

    def main() -> set[int]:
        tasks = [spawn(work) for _ in range(6)]
        return {task.join() for task in tasks}

    pids = Hub().run(main)
    assert len(pids) == 2
    assert max(seen) <= 2


def test_terminated_idle_connection_is_replaced(pool: ConnectionPool, server: str) -> None:
    """An idle pooled connection killed by the server is detected and replaced by a retried operation."""

    def backend(connection: HubConnection) -> int:
        row: Any = connection.execute("SELECT pg_backend_pid()").fetchone()
        return int(row[0])

    first = pool.retrying("probe", backend)
    with psycopg.connect(server, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s, 5000)", (first,))  # waits until it is gone
    second = pool.retrying("probe", backend)
    assert second != first


def test_permanent_errors_are_mapped_not_retried(pool: ConnectionPool) -> None:
    """A permanent server error becomes JournalUnavailable with its SQLSTATE, on one line."""
    with pytest.raises(JournalUnavailable, match="42P01") as caught:
        pool.retrying("probing", lambda connection: connection.execute("SELECT * FROM mayfly_no_such_table"))
    assert "\n" not in str(caught.value)


def test_transient_classification_of_real_errors(server: str) -> None:
    """An administrator's termination is transient; an undefined table is not."""
    with (
        psycopg.connect(server, autocommit=True) as victim,
        psycopg.connect(server, autocommit=True) as killer,
    ):
        killer.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(psycopg.Error) as terminated:
            victim.execute("SELECT 1")
    assert is_transient(terminated.value)
    with psycopg.connect(server, autocommit=True) as connection, pytest.raises(psycopg.Error) as undefined:
        connection.execute("SELECT * FROM mayfly_no_such_table")
    assert not is_transient(undefined.value)
    with pytest.raises(psycopg.Error) as refused:
        psycopg.connect(server.rsplit("/", 1)[0] + "/mayfly_no_such_database")
    assert not is_transient(refused.value)


def test_closed_pool_refuses_work(url: str) -> None:
    """After close, lending a connection raises JournalUnavailable instead of reconnecting."""
    pool = ConnectionPool(parse_url(url))
    pool.retrying("probe", lambda connection: connection.execute("SELECT 1"))
    pool.close()
    with pytest.raises(JournalUnavailable, match="closed"), pool.connection():
        pass


def test_a_task_cancelled_while_waiting_passes_its_turn_on(url: str) -> None:
    """A task cancelled while queued for a connection does not strand the tasks queued behind it."""
    pool = ConnectionPool(parse_url(with_options(url, pool_size=1)))
    done: list[str] = []

    def hold() -> None:
        with pool.connection() as connection:
            connection.execute("SELECT pg_sleep(0.2)")
        done.append("holder")

    def queued(name: str) -> None:
        with pool.connection() as connection:
            connection.execute("SELECT 1")
        done.append(name)

    def main() -> None:
        holder = spawn(hold)
        doomed = spawn(queued, "doomed")
        patient = spawn(queued, "patient")
        sleep(0.05)
        doomed.cancel("test")
        holder.join()
        patient.join()

    try:
        Hub().run(main)
    finally:
        pool.close()
    assert done == ["holder", "patient"]
