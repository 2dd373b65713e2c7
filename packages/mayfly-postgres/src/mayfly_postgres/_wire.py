"""Appends on the wire: named prepared statements sent through libpq in one pipeline and transaction.

An append is the journal's hottest statement, and psycopg's general
machinery around it (a cursor per statement, the query's conversion, each
parameter's adaptation, its prepared-statement bookkeeping, the results'
handling) cost about five times what libpq itself does: 43-53 µs of client
CPU per statement in a pipeline against 7-12 (``bench_round_trips.py``
prints the client CPU per node). So the append statements go through libpq
directly (``psycopg.pq``, psycopg's public libpq wrapper):

* each statement is prepared once per connection under a name derived from
  its text, in the same pipeline as its first use, and remembered on the
  connection only once the server confirmed it;
* its parameters go as text, in the order of their first use (every one of
  them is cast in the statement, so the server never has to guess a type);
* the statements and a Sync go in one pipeline, so they run in one implicit
  transaction that the Sync commits; one round trip, whatever their number;
* the waits are the connection's own (:meth:`HubConnection.wait`): parked on
  the hub in a hub task, psycopg's blocking wait elsewhere.

A statement the server refused raises its psycopg error (the transaction is
rolled back, the connection stays usable); any other failure (a lost
connection, a client-side error mid-pipeline) closes the connection before
raising, so nothing of the pipeline can commit later and the pool never lends
it again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final, final

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq

from mayfly_postgres._pool import HubConnection

__all__ = ["WireStatement", "send_together"]

_PLACEHOLDER: Final = re.compile(rb"%\((\w+)\)s|%%|%")
_WAIT_R: Final = 1  # psycopg's Wait.R, Wait.W, Wait.RW and Ready.R, as HubConnection.wait reads them
_WAIT_RW: Final = 3
_READY_R: Final = 1
_OK: Final = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


@final
class WireStatement:
    """A statement with ``%(name)s`` parameters, as a named prepared statement with ``$n`` ones."""

    __slots__ = ("name", "order", "text")

    def __init__(self, statement: bytes) -> None:
        order: list[str] = []

        def number(match: re.Match[bytes]) -> bytes:
            if match.group(1) is None:
                if match.group(0) == b"%%":
                    return b"%"
                raise ValueError(f"a wire statement takes %(name)s parameters only: {statement!r}")
            key = match.group(1).decode()
            if key not in order:
                order.append(key)
            return b"$%d" % (order.index(key) + 1)

        self.text = _PLACEHOLDER.sub(number, statement)
        self.order = tuple(order)
        self.name = b"mayfly_" + hashlib.blake2b(self.text, digest_size=12).hexdigest().encode()

    def values(self, parameters: Mapping[str, Any]) -> list[bytes | None]:
        """The parameters as libpq sends them: text, in the order the statement numbers them."""
        return [_text(parameters[key]) for key in self.order]


def _text(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    kind = type(value)
    if kind is bool:
        return b"t" if value else b"f"
    if kind is int:
        return str(value).encode()
    raise TypeError(f"a wire parameter is a str, an int, a bool or None, not {kind.__name__}")


def send_together(
    connection: HubConnection, sends: Sequence[tuple[WireStatement, list[bytes | None]]]
) -> list[pq.abc.PGresult]:
    """Run the statements in one pipeline and one implicit transaction; each one's result, in order.

    Raises the server's error for the first statement it refused (nothing
    committed; the connection is left idle and usable), or the driver's error
    for any other failure, after closing the connection (whether the Sync's
    commit happened is then unknown to the caller).
    """
    prepared = connection.wire_prepared
    if prepared is None:
        prepared = connection.wire_prepared = set()
    try:
        return _send(connection, sends, prepared)
    except pg_errors.InvalidSqlStatementName:
        # The session lost the statements: psycopg itself runs DEALLOCATE ALL after a ROLLBACK, a DROP or
        # an ALTER on the connection. The refusal came at the first one's Bind, so the transaction rolled
        # back and nothing of it committed: send it all again, parsing every statement first.
        prepared.clear()
        return _send(connection, sends, prepared)


def _send(
    connection: HubConnection, sends: Sequence[tuple[WireStatement, list[bytes | None]]], prepared: set[bytes]
) -> list[pq.abc.PGresult]:
    try:
        parsed = _to_parse(sends, prepared)
        results: list[pq.abc.PGresult] = connection.wait(_exchange(connection.pgconn, sends, parsed))
    except BaseException:
        connection.close()
        raise
    # The results in the order sent: each parse's (if any), then its statement's.
    answers: list[pq.abc.PGresult] = []
    refused: psycopg.Error | None = None
    position = 0
    for (statement, _), parse in zip(sends, parsed, strict=True):
        if parse:
            if results[position].status == pq.ExecStatus.COMMAND_OK:
                prepared.add(statement.name)
            refused = refused or _refusal(results[position], connection)
            position += 1
        answers.append(results[position])
        refused = refused or _refusal(results[position], connection)
        position += 1
    if refused is not None:
        raise refused
    return answers


def _refusal(result: pq.abc.PGresult, connection: HubConnection) -> psycopg.Error | None:
    """The error a result reports (the server's own, typed), or ``None`` for a success."""
    if result.status in _OK:
        return None
    if result.status == pq.ExecStatus.FATAL_ERROR:
        return pg_errors.error_from_result(result, encoding=connection.pgconn._encoding)
    return psycopg.errors.PipelineAborted(f"unexpected result status {result.status!r}")


def _to_parse(sends: Sequence[tuple[WireStatement, list[bytes | None]]], prepared: set[bytes]) -> list[bool]:
    """Which sends parse their statement first: each one not prepared yet, at its first use only."""
    parsing: set[bytes] = set()
    parsed = []
    for statement, _ in sends:
        parse = statement.name not in prepared and statement.name not in parsing
        parsing.add(statement.name)
        parsed.append(parse)
    return parsed


def _exchange(
    pgconn: pq.abc.PGconn, sends: Sequence[tuple[WireStatement, list[bytes | None]]], parsed: list[bool]
) -> Generator[int, int, list[pq.abc.PGresult]]:
    """The pipeline's I/O, as a generator of psycopg wait states; every result before the Sync's."""
    pgconn.enter_pipeline_mode()
    for (statement, values), parse in zip(sends, parsed, strict=True):
        if parse:
            pgconn.send_prepare(statement.name, statement.text)
        pgconn.send_query_prepared(statement.name, values)
    pgconn.pipeline_sync()
    while pgconn.flush():  # more to send: the server may be waiting for its answers to be read
        ready = yield _WAIT_RW
        if ready & _READY_R:
            pgconn.consume_input()
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            yield _WAIT_R
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            continue  # the end of one statement's results
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            break
        results.append(result)
    pgconn.exit_pipeline_mode()
    return results
