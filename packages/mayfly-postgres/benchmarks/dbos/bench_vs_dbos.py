"""Mayfly beside DBOS Transact on the same PostgreSQL, against the server's raw commit floor, in one run.

Usage (the ``bench_dbos`` nox session installs DBOS in a venv of its own)::

    nox -s bench_dbos
    nox -s bench_dbos -- [SERVER_URL] [--repeat 5] [--chain 100] [--runs 100] [--steps 10] [--quick]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Each repeat measures, on that
one server and database, every side in a fresh schema of its own (all dropped
at the end) and in a process of its own (``dbos_side.py``, ``mayfly_side.py``;
DBOS runs its own event loop and threads, which must never share a process
with Mayfly's hub, and neither side inherits the other's warm caches):

1. the raw floor: one-row ``INSERT`` + ``COMMIT`` on one connection with
   ``synchronous_commit=on`` (commits/s), before and after the two sides;
2. DBOS 3.4, default settings: a workflow of ``--chain`` sequential no-op
   ``@DBOS.step`` calls, run directly; ``--runs`` workflows of ``--steps``
   steps started at once with ``DBOS.start_workflow`` (and through a
   ``Queue``, the other way DBOS documents for running many workflows);
3. Mayfly, ``durability=durable``: a ``--chain``-node chain through
   ``WorkflowRuntime.execute``; ``--runs`` runs of ``--steps`` independent
   nodes submitted with ``start`` and driven by one ``Worker`` (and, the
   shape of a DBOS workflow, ``--runs`` runs of ``--steps``-node chains).

Both sides run no-op handlers inline (DBOS steps in the workflow's thread,
Mayfly handlers registered ``cooperative=True`` on the hub), so what is
measured is each engine recording its steps durably. Steps/s is steps (nodes)
completed per wall second, submission included. The order of the two sides
alternates between repeats. Printed: each repeat, then min and median of
each figure, the ratios Mayfly/DBOS and each side against the floor, and the
load average before and after. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def load() -> str:
    """The load average, as every benchmark here prints it."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def floor(conninfo: str, schema: str, seconds: float) -> float:
    """One-row INSERT commits (``synchronous_commit=on``) on one connection for ``seconds``: commits/s."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".floor (n bigint)')
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            conn.execute(f'INSERT INTO "{schema}".floor VALUES (%s)', (count,))
            count += 1
        return count / (time.perf_counter() - started)


def side(argv: list[str]) -> dict[str, float]:
    """Run one side's script in a fresh process; return the figures of its last output line."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{Path(argv[0]).name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{Path(argv[0]).name} printed no figures:\n{done.stdout}\n{done.stderr}")
    figures: dict[str, float] = json.loads(lines[-1])
    return figures


def server_settings(conninfo: str) -> str:
    """The server's version and the settings that decide what a commit waits for."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        values = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]  # SHOW returns one row
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        }
    return ", ".join(f"{name} {value}" for name, value in values.items())


def versions() -> str:
    """The versions under comparison, read from the installed metadata (DBOS is not imported here)."""
    names = ("dbos", "sqlalchemy", "mayfly-runtime", "mayfly-postgres", "psycopg")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "server", nargs="?", default=os.environ.get("MAYFLY_TEST_POSTGRES_URL", DEFAULT_SERVER)
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--floor-seconds", type=float, default=1.5)
    parser.add_argument(
        "--quick", action="store_true", help="one repeat, without the queue and chained-run variants"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    conninfo = args.server.split("?", 1)[0]
    tag = uuid.uuid4().hex[:8]
    schemas: list[str] = [f"bench_vs_dbos_{tag}_floor"]
    print(f"Mayfly beside DBOS on {conninfo}")
    print(f"  {platform.python_implementation()} {platform.python_version()}, {versions()}")
    print(f"  server: {server_settings(conninfo)}")
    print(
        f"  shapes: a chain of {args.chain} steps; {args.runs} runs x {args.steps} steps at once; "
        f"{args.repeat} repeat(s), each side in its own process and schema"
    )
    print(f"  before: {load()}")
    rows: list[dict[str, float]] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schemas[0]}"')
    try:
        for repeat in range(args.repeat):
            dbos_schema = f"bench_vs_dbos_{tag}_dbos_{repeat}"
            mayfly_schema = f"bench_vs_dbos_{tag}_mayfly_{repeat}"
            schemas += [dbos_schema, mayfly_schema]
            dbos_argv = [
                str(HERE / "dbos_side.py"),
                conninfo,
                dbos_schema,
                f"--chain={args.chain}",
                f"--runs={args.runs}",
                f"--steps={args.steps}",
                *([] if args.quick else ["--queue"]),
            ]
            mayfly_argv = [
                str(HERE / "mayfly_side.py"),
                f"{conninfo}?schema={mayfly_schema}",
                f"--chain={args.chain}",
                f"--runs={args.runs}",
                f"--nodes={args.steps}",
                *([] if args.quick else ["--chained-runs"]),
            ]
            first = floor(conninfo, schemas[0], args.floor_seconds)
            if repeat % 2 == 0:
                dbos, mayfly = side(dbos_argv), side(mayfly_argv)
            else:
                mayfly, dbos = side(mayfly_argv), side(dbos_argv)
            second = floor(conninfo, schemas[0], args.floor_seconds)
            row = {f"dbos_{k}": v for k, v in dbos.items()} | {f"mayfly_{k}": v for k, v in mayfly.items()}
            row |= {"floor": (first + second) / 2, "load": os.getloadavg()[0]}
            rows.append(row)
            print(
                f"  repeat {repeat + 1}: floor {row['floor']:,.0f} commits/s "
                f"(before {first:,.0f}, after {second:,.0f}); "
                f"chain DBOS {row['dbos_chain']:,.0f} / Mayfly {row['mayfly_chain']:,.0f} steps/s; "
                f"fan-out DBOS {row['dbos_fan']:,.0f} / Mayfly {row['mayfly_fan']:,.0f} steps/s; "
                f"load {row['load']:.2f}",
                flush=True,
            )
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    report(rows, args)


def report(rows: list[dict[str, float]], args: argparse.Namespace) -> None:
    """Print min and median of every figure, then the ratios (medians, and per repeat min-max)."""

    def stat(key: str) -> tuple[float, float]:
        values = [row[key] for row in rows]
        return min(values), statistics.median(values)

    def ratio(top: str, bottom: str) -> str:
        per = [row[top] / row[bottom] for row in rows]
        return f"{statistics.median(per):.2f}x (repeats {min(per):.2f}-{max(per):.2f}x)"

    print(f"\n  {len(rows)} repeat(s); min / median:")
    labels = [
        ("floor", "raw floor: one-row INSERT + COMMIT, one connection", "commits/s"),
        ("dbos_chain", f"DBOS: workflow of {args.chain} sequential steps", "steps/s"),
        ("mayfly_chain", f"Mayfly: {args.chain}-node chain, execute()", "steps/s"),
        ("dbos_fan", f"DBOS: {args.runs} x {args.steps} steps, start_workflow", "steps/s"),
        ("dbos_fan_queue", f"DBOS: {args.runs} x {args.steps} steps, Queue.enqueue", "steps/s"),
        ("mayfly_fan", f"Mayfly: {args.runs} runs x {args.steps} independent nodes, one Worker", "steps/s"),
        ("mayfly_fan_chained", f"Mayfly: {args.runs} runs x {args.steps}-node chains, one Worker", "steps/s"),
    ]
    for key, label, unit in labels:
        if key in rows[0]:
            low, mid = stat(key)
            print(f"  {label:<66} {low:8,.0f} / {mid:8,.0f} {unit}")
    commits = [
        f"{name} {statistics.median(row[key] for row in rows):.2f}"
        for name, key in (
            ("chain", "mayfly_chain_commits_per_node"),
            ("fan-out", "mayfly_fan_commits_per_node"),
            ("chained runs", "mayfly_fan_chained_commits_per_node"),
        )
        if key in rows[0]
    ]
    print(f"  Mayfly commits per node (observer): {', '.join(commits)}")
    share = statistics.median(row["mayfly_fan_submit_share"] for row in rows)
    print(f"  Mayfly fan-out: submitting the runs took {share:.0%} of its time (median)")
    print("\n  ratios (median of the per-repeat ratios):")
    print(f"  serial chain, Mayfly / DBOS:                 {ratio('mayfly_chain', 'dbos_chain')}  (goal 4x)")
    print(f"  fan-out, Mayfly / DBOS (start_workflow):     {ratio('mayfly_fan', 'dbos_fan')}  (goal 10x)")
    if "dbos_fan_queue" in rows[0]:
        print(f"  fan-out, Mayfly / DBOS (Queue):              {ratio('mayfly_fan', 'dbos_fan_queue')}")
    if "mayfly_fan_chained" in rows[0]:
        print(f"  chained runs, Mayfly / DBOS (start_workflow): {ratio('mayfly_fan_chained', 'dbos_fan')}")
    print(f"  DBOS chain / floor:                          {ratio('dbos_chain', 'floor')}")
    print(f"  Mayfly chain / floor:                        {ratio('mayfly_chain', 'floor')}")
    print(f"  DBOS fan-out / floor:                        {ratio('dbos_fan', 'floor')}")
    print(f"  Mayfly fan-out / floor:                      {ratio('mayfly_fan', 'floor')}")
    print(f"  after: {load()}")


if __name__ == "__main__":
    main()
