"""Chaos: the Redis server is SIGKILLed in the middle of a workflow run, restarted, and the run resumes.

A child process drives a chain through ``WorkflowRuntime`` on the private AOF
server. The server is killed while nodes are running; the child must fail with
Mayfly's own error (never a redis-py exception). After a restart on the same
AOF, another runtime takes the run over once the dead holder's lease expires
and finishes it: every node succeeds, the history is contiguous and verified.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from mayfly.model.outcomes import Succeeded
from mayfly.model.state import NodeStatus
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis.testing import RedisServer

NODES = 40
LEASE_TTL_MS = 1000

DRIVER = textwrap.dedent(
    f"""
    import sys
    from mayfly.model.errors import MayflyError
    from mayfly.model.outcomes import Succeeded
    from mayfly.model.spec import Node, RetryPolicy, RunBudgets, WorkflowSpec
    from mayfly.runtime import HandlerRegistry, WorkflowRuntime
    from mayfly.substrate import sleep
    from mayfly_redis import RedisJournal, RedisLeaseStore

    url, run_id = sys.argv[1], sys.argv[2]
    registry = HandlerRegistry()

    def step(request):
        sleep(0.02)
        print("done " + request.node_id, flush=True)
        return Succeeded()

    registry.register("step", 1, step, cooperative=True)
    one = RetryPolicy(max_attempts=1)
    nodes = [Node("n0", handler="step@1", retry=one)]
    nodes += [Node(f"n{{i}}", handler="step@1", depends_on=(f"n{{i - 1}}",), retry=one) for i in range(1, {NODES})]
    spec = WorkflowSpec(workflow_id="chaos.chain", version=1, nodes=tuple(nodes),
                        budgets=RunBudgets(max_attempts=10_000, max_transitions=10_000))
    runtime = WorkflowRuntime(RedisJournal(url), registry, leases=RedisLeaseStore(url),
                              lease_ttl_ms={LEASE_TTL_MS})
    try:
        runtime.execute(spec, run_id=run_id)
    except MayflyError as error:
        print("mayfly-error " + type(error).__name__ + ": " + str(error), flush=True)
        sys.exit(3)
    print("finished", flush=True)
    """
)


def step(request: HandlerRequest) -> Succeeded:
    """The resuming runtime's handler: succeed at once."""
    return Succeeded()


def test_run_survives_a_server_kill_mid_run(fresh_server: RedisServer, run_id: str) -> None:
    """SIGKILL redis-server mid-run: the driver fails with a Mayfly error, a restart resumes to success."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, fresh_server.url, run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        for _ in range(10):
            line = driver.stdout.readline()
            assert line.startswith("done "), line + (driver.stderr.read() if driver.stderr else "")
        fresh_server.kill()
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate(timeout=30)
    last = out.strip().splitlines()[-1]
    assert driver.returncode == 3, f"driver exit {driver.returncode}: {last} {err[-2000:]}"
    assert last.startswith("mayfly-error JournalUnavailable"), last
    assert "redis.exceptions" not in err

    fresh_server.start()
    time.sleep(LEASE_TTL_MS / 1000 + 0.5)  # the killed driver's lease expires (its TTL survived the restart)
    registry = HandlerRegistry()
    registry.register("step", 1, step, cooperative=True)
    with RedisJournal(fresh_server.url) as journal, RedisLeaseStore(fresh_server.url) as leases:
        before = journal.next_sequence(run_id) - 1
        assert before > 0, "the run's history from before the kill is there"
        result = WorkflowRuntime(journal, registry, leases=leases).resume(run_id)
        assert result.succeeded, result
        assert len(result.nodes) == NODES
        assert {node.status for node in result.nodes.values()} == {NodeStatus.SUCCEEDED}
        history = journal.read(run_id)
        assert [record.sequence for record in history] == list(range(1, len(history) + 1))
        assert len(history) > before
