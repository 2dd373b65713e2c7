"""Benchmark: the console's run list page on PostgreSQL with 100k runs, beside the raw index query.

Usage: python bench_console.py [SERVER_URL] [--runs 100000] [--page 50] [--repeat 10]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Everything runs in a fresh
schema (``console_bench_...``) that is dropped at the end.

Fill: one real run's history (a two-node workflow run to success by the
reducer, 8 records) is re-sealed for each of ``--runs`` run ids (its run id
rewritten, every checksum recomputed, so each history reads and verifies like
an appended one), then written with ``COPY`` into the journal's tables, with
the ``runs`` summary rows one second apart in ``updated_at``. (The fill goes
under the SPI to be quick; the pages read it through the SPI only.)

Timed, median of ``--repeat``:

- floor: the raw keyset query the page stands on (``SELECT ... FROM runs
  ORDER BY updated_at DESC, run_id LIMIT page``) over psycopg, one round trip;
- the first page, and a page 90% deep (a cursor at the 90,000th run): the
  console's ``list_page`` (index query + ``inspect_runs`` of the listed runs,
  one ``run_tails`` statement for the page) and the whole WSGI response for
  ``/runs?limit=page``, with its ratio to the floor;
- for contrast, the same raw query with ``OFFSET`` at that depth (what an
  offset pager would pay per page), the page's raw work as it is now (the
  index query, then one ``SELECT`` of every listed run's records), and as it
  was before ``run_tails`` (the index query, then one ``SELECT`` of each
  listed run's records);
- the same ``list_page`` on a journal that hides ``run_tails``, so it
  inspects the runs one by one (two reads each), as it did before the feature;
- the statements each ``list_page`` sends to the server for one page (counted).

Numbers are printed, never asserted; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import statistics
import time
import uuid
import wsgiref.util
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import msgspec
import psycopg
from psycopg import sql

from mayfly.commit import seal_events
from mayfly.console import Console
from mayfly.console._data import list_page
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, WorkflowSpec
from mayfly.plugins import plugin_manager
from mayfly.testing import ReducerHarness
from mayfly_postgres import PostgresJournal
from mayfly_postgres._pool import HubConnection

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: plans, caches, connections
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


class _WithoutTails:
    """The journal with ``run_tails`` declared absent: the run list then inspects its runs one by one."""

    def __init__(self, journal: PostgresJournal) -> None:
        self._journal = journal
        self.capabilities = msgspec.structs.replace(journal.capabilities, run_tails=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)


def _statements_of(fn: Callable[[], object]) -> int:
    """How many statements the journal's connections executed while ``fn`` ran."""
    counted = [0]
    execute = HubConnection.execute

    def counting(self: HubConnection, *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return execute(self, *args, **kwargs)

    HubConnection.execute = counting  # type: ignore[method-assign]  # a benchmark's probe
    try:
        fn()
    finally:
        HubConnection.execute = execute  # type: ignore[method-assign]
    return counted[0]


def _template() -> tuple[str, list[JournalRecord]]:
    spec = WorkflowSpec(
        workflow_id="bench.console",
        version=1,
        nodes=(Node("fetch", handler="fetch@1"), Node("ship", handler="ship@1", depends_on=("fetch",))),
    )
    harness = ReducerHarness(spec, input={"ticket": "bench"})
    harness.run_script({"fetch": [Succeeded(output={"rows": 1})], "ship": [Succeeded(output={"ok": True})]})
    records = seal_events(harness.run_id, 1, harness.history, Uuid7IdSource())
    return harness.run_id, records


def fill(url: str, server: str, schema: str, runs: int) -> list[str]:
    """Write ``runs`` copies of the template history; return the run ids, newest first."""
    PostgresJournal(url).close()  # creates the schema and its tables
    template_id, template = _template()
    ids = Uuid7IdSource()
    run_ids = [ids.new_id() for _ in range(runs)]
    now = datetime.datetime.now(tz=datetime.UTC)
    started = time.perf_counter()
    with psycopg.connect(server, autocommit=False) as connection:
        table = sql.SQL("{}.{}").format
        with connection.cursor() as cursor:
            with cursor.copy(
                sql.SQL(
                    "COPY {} (run_id, sequence, event_id, event_type, schema_version, payload, checksum) "
                    "FROM STDIN"
                ).format(table(sql.Identifier(schema), sql.Identifier("records")))
            ) as copy:
                old = template_id.encode()
                for run_id in run_ids:
                    new = run_id.encode()
                    for record in template:
                        sealed = JournalRecord.seal(
                            run_id=run_id,
                            sequence=record.sequence,
                            event_id=ids.new_id(),
                            event_type=record.event_type,
                            schema_version=record.schema_version,
                            payload=record.payload.replace(old, new),
                        )
                        copy.write_row(
                            (
                                run_id,
                                sealed.sequence,
                                sealed.event_id,
                                sealed.event_type,
                                sealed.schema_version,
                                sealed.payload,
                                sealed.checksum,
                            )
                        )
            last = len(template)
            with cursor.copy(
                sql.SQL(
                    "COPY {} (run_id, next_sequence, workflow_id, status, created_at, updated_at) FROM STDIN"
                ).format(table(sql.Identifier(schema), sql.Identifier("runs")))
            ) as copy:
                for i, run_id in enumerate(run_ids):
                    moment = now - datetime.timedelta(seconds=runs - i)
                    copy.write_row((run_id, last + 1, "bench.console", "succeeded", moment, moment))
        connection.commit()
        # What autovacuum does soon after such a fill: the planner then knows a run has 8 records.
        for name in ("runs", "records", "snapshots"):
            analyze = sql.SQL("ANALYZE {}").format(table(sql.Identifier(schema), sql.Identifier(name)))
            connection.execute(analyze)
        connection.commit()
    seconds = time.perf_counter() - started
    print(f"fill: {runs} runs ({runs * len(template)} records) in {seconds:.1f} s")
    return list(reversed(run_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", nargs="?", default=os.environ.get("MAYFLY_TEST_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    schema = f"console_bench_{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in args.server else "?"
    url = f"{args.server}{separator}schema={schema}"
    try:
        newest_first = fill(url, args.server, schema, args.runs)
        journal = PostgresJournal(url)
        console = Console(url)
        upcasters = plugin_manager().event_upcasters()
        runs_table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier("runs"))
        depth = min(args.runs - args.page, args.runs * 9 // 10)
        with psycopg.connect(args.server, autocommit=True) as raw:

            def floor() -> object:
                return raw.execute(
                    sql.SQL(
                        "SELECT run_id, workflow_id, status, next_sequence - 1, created_at, updated_at "
                        "FROM {} "
                        "WHERE next_sequence > 1 ORDER BY updated_at DESC, run_id LIMIT %s"
                    ).format(runs_table),
                    (args.page,),
                ).fetchall()

            def offset() -> object:
                return raw.execute(
                    sql.SQL(
                        "SELECT run_id, workflow_id, status, next_sequence - 1, created_at, updated_at "
                        "FROM {} "
                        "WHERE next_sequence > 1 ORDER BY updated_at DESC, run_id LIMIT %s OFFSET %s"
                    ).format(runs_table),
                    (args.page, depth),
                ).fetchall()

            records_table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier("records"))

            def raw_page() -> object:
                # The page's raw work now: the index query, then every listed run's records in one query.
                found = floor()
                assert isinstance(found, list)
                return raw.execute(
                    sql.SQL(
                        "SELECT run_id, sequence, payload, checksum FROM {} WHERE run_id = ANY(%s) "
                        "ORDER BY run_id, sequence"
                    ).format(records_table),
                    ([row[0] for row in found],),
                ).fetchall()

            def raw_page_per_run() -> object:
                # The page's raw work before run_tails: the index query, then each run's records, one by one.
                found = floor()
                assert isinstance(found, list)
                return [
                    raw.execute(
                        sql.SQL(
                            "SELECT sequence, payload, checksum FROM {} WHERE run_id = %s ORDER BY sequence"
                        ).format(records_table),
                        (row[0],),
                    ).fetchall()
                    for row in found
                ]

            (stamp,) = raw.execute(
                sql.SQL("SELECT updated_at FROM {} WHERE run_id = %s").format(runs_table),
                (newest_first[depth - 1],),
            ).fetchone()
            deep_cursor = f"t~{stamp.isoformat()}~1"
            first = list_page(journal, upcasters, limit=args.page)
            deep = list_page(journal, upcasters, cursor=deep_cursor, limit=args.page)
            assert [row.run_id for row in first.rows] == newest_first[: args.page]
            assert [row.run_id for row in deep.rows] == newest_first[depth : depth + args.page]
            assert all(row.status == "succeeded" for row in first.rows + deep.rows)

            def page(cursor: str | None) -> Callable[[], object]:
                return lambda: list_page(journal, upcasters, cursor=cursor, limit=args.page)

            def response(query: str) -> Callable[[], object]:
                def call() -> object:
                    environ = {"PATH_INFO": "/runs", "QUERY_STRING": query, "wsgi.input": io.BytesIO()}
                    wsgiref.util.setup_testing_defaults(environ)
                    answered: list[str] = []
                    body = b"".join(console(environ, lambda status, headers: answered.append(status)))
                    assert answered == ["200 OK"] and body.count(b"<tr data-run=") == args.page, answered
                    return body

                return call

            one_by_one = _WithoutTails(journal)
            statements = _statements_of(lambda: list_page(journal, upcasters, limit=args.page))
            statements_before = _statements_of(lambda: list_page(one_by_one, upcasters, limit=args.page))
            floor_ms = _median_ms(floor, args.repeat)
            rows = [
                ("raw keyset query (floor)", floor_ms),
                ("raw OFFSET query at the deep page", _median_ms(offset, args.repeat)),
                ("raw page: index query + the runs' records", _median_ms(raw_page, args.repeat)),
                ("raw page, one query per run (before)", _median_ms(raw_page_per_run, args.repeat)),
                ("list_page, first page", _median_ms(page(None), args.repeat)),
                (f"list_page, page at run {depth}", _median_ms(page(deep_cursor), args.repeat)),
                (
                    "list_page, first page, run by run (before)",
                    _median_ms(lambda: list_page(one_by_one, upcasters, limit=args.page), args.repeat),
                ),
                ("GET /runs (whole page), first", _median_ms(response(f"limit={args.page}"), args.repeat)),
                (
                    f"GET /runs (whole page), at run {depth}",
                    _median_ms(response(urlencode({"limit": args.page, "cursor": deep_cursor})), args.repeat),
                ),
            ]
        load = os.getloadavg()
        print(
            f"{args.runs} runs, pages of {args.page}, median of {args.repeat}; "
            f"load {load[0]:.2f} {load[1]:.2f}"
        )
        for name, ms in rows:
            print(f"  {name:<42} {ms:9.2f} ms   {ms / floor_ms:7.1f} x floor")
        print(f"  floor: {floor_ms:.2f} ms (one round trip of the index query)")
        print(
            f"  statements list_page sent for one page of {args.page}: {statements} "
            f"(run by run, before: {statements_before})"
        )
        console.close()
        journal.close()
    finally:
        with psycopg.connect(args.server, autocommit=True) as connection:
            connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
