"""Appends on the wire: prepared once per session, one pipeline and transaction, refusals typed, losses closed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pgserver import IDS, batch, with_options

from mayfly.substrate import Hub, sleep, spawn
from mayfly_postgres import PostgresJournal
from mayfly_postgres._pool import ConnectionPool, HubConnection
from mayfly_postgres._url import parse_url
from mayfly_postgres._wire import WireStatement, send_together


@pytest.fixture
def pool(url: str) -> Iterator[ConnectionPool]:
    opened = ConnectionPool(parse_url(with_options(url, pool_size=2, application_name="mayfly_wire_test")))
    yield opened
    opened.close()


@pytest.fixture
def table(server: str) -> Iterator[str]:
    """A scratch table with a unique key (a constraint of its own, named for the test)."""
    name = f"mayfly_wire_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(
            f"CREATE TABLE {name} (k bigint CONSTRAINT {name}_k PRIMARY KEY, v text, flag boolean, n bigint)"
        )
    yield name
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f"DROP TABLE {name}")


def insert(table: str) -> WireStatement:
    return WireStatement(
        f"INSERT INTO {table} SELECT %(k)s::bigint, %(v)s::text, %(flag)s::boolean, %(n)s::bigint "
        "WHERE %(k)s::bigint >= 0".encode()
    )


def rows(server: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(server, autocommit=True) as connection:
        return connection.execute(f"SELECT k, v, flag, n FROM {table} ORDER BY k").fetchall()


@pytest.mark.parametrize(
    ("text", "expected", "order"),
    [
        (b"SELECT %(a)s::int, %(b)s::text, %(a)s::int", b"SELECT $1::int, $2::text, $1::int", ("a", "b")),
        (b"SELECT 1 WHERE 'x' LIKE 'x%%'", b"SELECT 1 WHERE 'x' LIKE 'x%'", ()),
    ],
)
def test_a_statement_numbers_its_named_parameters_in_order_of_first_use(
    text: bytes, expected: bytes, order: tuple[str, ...]
) -> None:
    statement = WireStatement(text)
    assert (statement.text, statement.order) == (expected, order)
    assert statement.name == WireStatement(text).name  # a name per text, the same in every process
    assert statement.name.startswith(b"mayfly_")


def test_positional_parameters_and_other_value_types_are_refused() -> None:
    with pytest.raises(ValueError, match="takes %\\(name\\)s parameters only"):
        WireStatement(b"SELECT %s::int")
    statement = WireStatement(b"SELECT %(a)s::float8")
    with pytest.raises(TypeError, match="not float"):
        statement.values({"a": 1.5})
    assert WireStatement(b"SELECT %(a)s, %(b)s, %(c)s, %(d)s").values(
        {"a": None, "b": True, "c": -12, "d": "é"}
    ) == [None, b"t", b"-12", "é".encode()]


def test_statements_commit_together_and_each_is_prepared_once_per_session(
    pool: ConnectionPool, server: str, table: str
) -> None:
    """Two calls on one connection: the statement is parsed on the first only; both pipelines commit."""
    statement = insert(table)
    with pool.connection() as connection:
        first = send_together(
            connection,
            [
                (statement, statement.values({"k": 1, "v": "one", "flag": True, "n": None})),
                (statement, statement.values({"k": 2, "v": "two", "flag": False, "n": 7})),
            ],
        )
        assert connection.wire_prepared == {statement.name}
        second = send_together(
            connection, [(statement, statement.values({"k": -3, "v": "no", "flag": True, "n": 1}))]
        )
        assert [r.command_tuples for r in first + second] == [1, 1, 0]
        names = connection.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'mayfly_%'"
        ).fetchall()
        assert names == [(statement.name.decode(),)]
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert rows(server, table) == [(1, "one", True, None), (2, "two", False, 7)]


def test_a_refused_statement_raises_its_typed_error_and_rolls_the_whole_pipeline_back(
    pool: ConnectionPool, server: str, table: str
) -> None:
    """The second statement breaks the key: UniqueViolation with its constraint; the first one's row is gone too.

    The statement is parsed in that same pipeline: a named statement outlives the transaction's rollback, so
    the session remembers it and the next call runs it without parsing it again."""
    statement = insert(table)
    with psycopg.connect(server, autocommit=True) as other:
        other.execute(f"INSERT INTO {table} VALUES (5, 'five', true, 5)")
    with pool.connection() as connection:
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            send_together(
                connection,
                [
                    (statement, statement.values({"k": 6, "v": "six", "flag": True, "n": 6})),
                    (statement, statement.values({"k": 5, "v": "again", "flag": True, "n": 5})),
                    (statement, statement.values({"k": 8, "v": "eight", "flag": True, "n": 8})),
                ],
            )
        assert refused.value.diag.constraint_name == f"{table}_k"
        assert not connection.closed  # a refusal leaves the session idle and usable
        assert connection.wire_prepared == {statement.name}
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        (result,) = send_together(
            connection, [(statement, statement.values({"k": 9, "v": "x", "flag": False, "n": 0}))]
        )
        assert result.command_tuples == 1
    assert [row[0] for row in rows(server, table)] == [5, 9]


@pytest.mark.parametrize("how", ["DEALLOCATE ALL", "psycopg after a DROP"])
def test_a_statement_deallocated_behind_its_back_is_prepared_again(
    pool: ConnectionPool, server: str, table: str, how: str
) -> None:
    """The session loses the statement (psycopg runs DEALLOCATE ALL itself after a DROP, an ALTER or a ROLLBACK
    once it prepared statements of its own): the next call parses it again and commits once."""
    statement = insert(table)
    with pool.connection() as connection:
        send_together(connection, [(statement, statement.values({"k": 1, "v": "a", "flag": True, "n": 1}))])
        if how == "DEALLOCATE ALL":
            connection.execute("DEALLOCATE ALL")
        else:
            for _ in range(8):  # past psycopg's prepare threshold: it holds a statement of its own
                connection.execute("SELECT %s::int", (1,))
            connection.execute("CREATE TEMP TABLE mayfly_wire_scratch (n int)")
            connection.execute("DROP TABLE mayfly_wire_scratch")
        left = connection.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'mayfly_%'")
        assert left.fetchone() == (0,)
        (result,) = send_together(
            connection, [(statement, statement.values({"k": 2, "v": "b", "flag": True, "n": 2}))]
        )
        assert result.command_tuples == 1
        assert connection.wire_prepared == {statement.name}
    assert [row[0] for row in rows(server, table)] == [1, 2]


def test_a_session_lost_mid_pipeline_closes_the_connection(
    pool: ConnectionPool, server: str, table: str
) -> None:
    """The server ends the session while the pipeline waits on a lock: a driver error, the connection closed."""
    statement = WireStatement(f"SELECT pg_sleep(%(s)s::float8), %(k)s::bigint FROM {table} LIMIT 1".encode())
    with psycopg.connect(server, autocommit=True) as other:
        other.execute(f"INSERT INTO {table} VALUES (1, 'x', true, 1)")
    lost: list[BaseException] = []
    held: list[HubConnection] = []

    def victim() -> None:
        with pool.connection() as connection:
            held.append(connection)
            try:
                send_together(connection, [(statement, statement.values({"s": "5", "k": 1}))])
            except psycopg.Error as error:
                lost.append(error)

    def killer() -> None:
        sleep(0.3)
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'mayfly_wire_test' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()"
            )

    def main() -> None:
        for task in [spawn(victim), spawn(killer)]:
            task.join()

    Hub().run(main)
    assert len(lost) == 1 and lost[0].sqlstate in (None, "57P01"), lost
    assert held[0].closed


def test_a_group_of_runs_appends_in_one_pipeline_on_a_fresh_session(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four runs' first and later batches (two statements, each used twice) on a new journal: every batch is
    acknowledged from the group's one transaction, none falls back to an append of its own."""

    def alone(self: object, item: object) -> object:
        raise AssertionError(f"a batch fell back to an append of its own: {item!r}")

    runs = [IDS.new_id() for _ in range(4)]
    with PostgresJournal(url) as journal:
        monkeypatch.setattr(PostgresJournal, "_outcome", alone)
        first = journal._flush_group([(run, 1, tuple(batch(run, 1)), None, None) for run in runs])
        later = journal._flush_group([(run, 4, tuple(batch(run, 4, 2)), None, None) for run in runs])
        assert [len(result.records) for result in first + later] == [3] * 4 + [2] * 4  # type: ignore[union-attr]
        assert [len(journal.read(run)) for run in runs] == [5] * 4
