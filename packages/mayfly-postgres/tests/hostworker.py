"""A runtime process for multi-host and chaos tests: ``python hostworker.py MODE URL ...``.

Modes (each prints one line per fact, flushed at once):

- ``recover URL OWNER RUN...``: wait for "go" on stdin, then try to resume
  every run (in an owner-specific order) with a WorkflowRuntime owned by
  OWNER; prints ``drove RUN STATUS`` or ``held RUN``.
- ``stale URL RUN``: acquire the run's lease for one second, print ``held
  TOKEN``, wait for a line, then try to append and renew under that token;
  prints ``fenced CURRENT`` or ``appended``, then ``lost`` or ``renewed``.
- ``chain URL RUN NODES``: execute a chain of NODES cooperative steps as RUN;
  prints ``done STATUS``.
"""

from __future__ import annotations

import random
import sys

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowRuntime, WorkflowSpec
from mayfly.journal import JournalRecord
from mayfly.model.errors import FencingRejected, LeaseHeld, LeaseLost
from mayfly.substrate import sleep
from mayfly_postgres import PostgresJournal, PostgresLeaseStore


def chain(nodes: int, workflow: str = "pg.chain") -> WorkflowSpec:
    """A chain of ``nodes`` steps, each depending on the one before."""
    return WorkflowSpec(
        workflow_id=workflow,
        version=1,
        nodes=tuple(
            Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(nodes)
        ),
    )


def registry(owner: str, pause_s: float) -> HandlerRegistry:
    """A registry whose cooperative step naps, then reports which owner ran it."""
    handlers = HandlerRegistry()

    @handlers.handler("step", cooperative=True)
    def step(request: HandlerRequest) -> Succeeded:
        sleep(pause_s)
        return Succeeded(output={"owner": owner, "node": request.node_id})

    return handlers


def say(line: str) -> None:
    """Print one line for the parent, at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def recover(url: str, owner: str, runs: list[str]) -> None:
    """Race other processes to resume every run; report which ones this owner drove."""
    journal, leases = PostgresJournal(url), PostgresLeaseStore(url)
    runtime = WorkflowRuntime(journal, registry(owner, 0.005), leases=leases, owner=owner)
    random.Random(owner).shuffle(runs)
    say("ready")
    sys.stdin.readline()
    for run in runs:
        try:
            result = runtime.resume(run)
        except LeaseHeld:
            say(f"held {run}")
            continue
        say(f"drove {run} {result.status.value}")


def stale(url: str, run: str) -> None:
    """Hold a short lease, get paused by the parent, then try to use the stale token."""
    journal, leases = PostgresJournal(url), PostgresLeaseStore(url)
    guard = leases.acquire(run, "stale-owner", 1000)
    say(f"held {guard.fencing_token}")
    sys.stdin.readline()
    sequence = journal.next_sequence(run)
    record = JournalRecord.seal(
        run_id=run,
        sequence=sequence,
        event_id="00000000-0000-7000-8000-00000000aaaa",
        event_type="StaleWrite",
        schema_version=1,
        payload=b"{}",
    )
    try:
        journal.append(run, sequence, [record], fence=guard.fencing_token)
        say("appended")
    except FencingRejected as rejected:
        say(f"fenced {rejected.current}")
    try:
        guard.renew()
        say("renewed")
    except LeaseLost:
        say("lost")


def drive_chain(url: str, run: str, nodes: int) -> None:
    """Execute a chain as ``run`` and report its final status."""
    journal, leases = PostgresJournal(url), PostgresLeaseStore(url)
    runtime = WorkflowRuntime(journal, registry("chain", 0.02), leases=leases, owner="chain")
    result = runtime.execute(chain(nodes), run_id=run)
    say(f"done {result.status.value}")


def main() -> None:
    """Dispatch on the mode."""
    mode, url, *rest = sys.argv[1:]
    if mode == "recover":
        recover(url, rest[0], rest[1:])
    elif mode == "stale":
        stale(url, rest[0])
    elif mode == "chain":
        drive_chain(url, rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
