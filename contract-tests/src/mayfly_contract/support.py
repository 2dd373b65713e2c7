"""Helpers shared by the contract tests: record factories and child processes reopening a backend."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Final, Self

from mayfly.commit import commit_command, seal_events
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord, SnapshotRecord, WorkflowJournal
from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    Command,
    CompleteAttempt,
    CreateRun,
    DeliverSignal,
    OpenSignalWait,
    Rejection,
    StartNodes,
)
from mayfly.model.events import ParentLink
from mayfly.model.outcomes import RetryableFailure, Succeeded
from mayfly.model.signals import SignalToken
from mayfly.model.spec import FixedBackoff, Node, RetryPolicy, WorkflowSpec
from mayfly.model.state import RunState
from mayfly.reducer import decide, reduce

__all__ = ["RETRY_DELAY_MS", "Child", "Records", "ScriptedRun", "SlowRelay", "snapshot_of"]


class Records:
    """Builds sealed records with fresh event ids (UUIDv7, so runs never collide across sessions).

    Every id :meth:`new_id` hands out (the suite's run ids) is added to
    ``created`` when one is given, so the session can purge its probe runs
    from the store at the end.
    """

    def __init__(self, created: set[str] | None = None) -> None:
        self._ids = Uuid7IdSource()
        self._created = created

    def new_id(self) -> str:
        """Return a fresh UUIDv7 string (recorded as a probe run id)."""
        fresh = self._ids.new_id()
        if self._created is not None:
            self._created.add(fresh)
        return fresh

    def batch(
        self, run_id: str, first: int, count: int = 1, *, payload: bytes | None = None
    ) -> list[JournalRecord]:
        """Return ``count`` records of ``run_id`` at sequences ``first, first + 1, ...``."""
        return [
            JournalRecord.seal(
                run_id=run_id,
                sequence=sequence,
                event_id=self._ids.new_id(),
                event_type="ContractProbe",
                schema_version=1,
                payload=payload
                if payload is not None
                else json.dumps({"sequence": sequence, "note": "é✓"}, ensure_ascii=False).encode(),
            )
            for sequence in range(first, first + count)
        ]

    def record(
        self, run_id: str, sequence: int, *, event_id: str | None = None, payload: bytes = b"{}"
    ) -> JournalRecord:
        """Return one record, optionally reusing an event id."""
        return JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=event_id or self._ids.new_id(),
            event_type="ContractProbe",
            schema_version=1,
            payload=payload,
        )


def snapshot_of(record: JournalRecord, state: bytes = b'{"state":"probe"}') -> SnapshotRecord:
    """Return a sealed snapshot that includes ``record`` last."""
    return SnapshotRecord.seal(
        run_id=record.run_id,
        schema_version=1,
        last_sequence=record.sequence,
        last_event_id=record.event_id,
        last_record_checksum=record.checksum,
        spec_checksum="sha256:" + "a" * 64,
        state_checksum="sha256:" + "b" * 64,
        state=state,
    )


RETRY_DELAY_MS = 3_600_000
"""The retry backoff of a :class:`ScriptedRun`'s node: it waits an hour after its first failure."""

_SPEC = WorkflowSpec(
    workflow_id="contract.runindex",
    version=1,
    nodes=(
        Node(
            "a",
            handler="contract-ok@1",
            retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=RETRY_DELAY_MS)),
        ),
    ),
)
_TOKEN = SignalToken("contract-signal-token-0001")


class ScriptedRun:
    """One real run (valid events, a pinned spec) moved through a fixed history, one command at a time.

    The history visits every index status and both ways of leaving a wait:
    ``new`` (created), ``running`` (attempt started), ``waiting`` until
    :attr:`retry_at` (a retryable failure after ``delay_ms + 1`` ms of
    virtual time), ``running`` again (time advanced past the
    backoff releases the retry; a second attempt starts), ``waiting`` with no
    wake time (a signal wait), ``running`` (the signal accepted) and
    ``terminal`` (succeeded). Each step is one commit through
    :func:`mayfly.commit.commit_command`, so a journal that keeps the run
    index receives every batch through ``append_indexed``; ``indexed=False``
    appends the same records with plain ``append``.
    """

    STEPS: Final = 9
    """The number of commits the whole history takes."""

    def __init__(
        self,
        run_id: str,
        *,
        queue: str,
        epoch_ms: int,
        delay_ms: int = 0,
        parent: str | None = None,
        dedup_id: str | None = None,
        priority: int = 0,
    ) -> None:
        self.run_id = run_id
        self.queue = queue
        self.dedup_id = dedup_id
        self.priority = priority
        self.epoch_ms = epoch_ms
        self.delay_ms = delay_ms
        self.parent = parent
        self.state: RunState | None = None
        self.step = 0
        self._ids = Uuid7IdSource()
        self._attempts = (self._ids.new_id(), self._ids.new_id())

    @property
    def retry_at(self) -> int:
        """The wall time (ms) the run waits for after its first failure (step 4)."""
        return self.epoch_ms + self.delay_ms + 1 + RETRY_DELAY_MS

    @property
    def done(self) -> bool:
        """Whether the whole history is committed."""
        return self.step >= self.STEPS

    def _command(self) -> Command:
        first, second = self._attempts
        link = None
        if self.parent is not None:
            link = ParentLink(run_id=self.parent, node_id="a", attempt_id=first, depth=1)
        commands: tuple[Command, ...] = (
            CreateRun(
                run_id=self.run_id,
                spec=_SPEC,
                epoch_ms=self.epoch_ms,
                queue=self.queue,
                parent=link,
                dedup_id=self.dedup_id,
                priority=self.priority,
            ),
            StartNodes((AttemptStart("a", first),)),
            AdvanceTime(self.delay_ms + 1),
            CompleteAttempt("a", first, RetryableFailure(reason="contract probe")),
            AdvanceTime(self.delay_ms + 1 + RETRY_DELAY_MS),
            StartNodes((AttemptStart("a", second),)),
            OpenSignalWait(node_id="a", attempt_id=second, name="go", token_sha256=_TOKEN.digest),
            DeliverSignal(node_id="a", signal_id=self._ids.new_id(), token=_TOKEN, name="go"),
            CompleteAttempt("a", second, Succeeded()),
        )
        return commands[self.step]

    def advance(
        self, journal: WorkflowJournal, *, fence: int | None = None, indexed: bool = True
    ) -> RunState:
        """Commit the next step of the history and return the run's new state."""
        command = self._command()
        if indexed:
            self.state = commit_command(journal, self.state, command, ids=self._ids, fence=fence).state
        else:
            events = decide(self.state, command)
            assert not isinstance(events, Rejection), events
            first = 1 if self.state is None else self.state.sequence + 1
            journal.append(self.run_id, first, seal_events(self.run_id, first, events, self._ids), fence)
            state = self.state
            for offset, event in enumerate(events):
                state = reduce(state, event, first + offset)
            assert state is not None
            self.state = state
        self.step += 1
        return self.state

    def advance_to(self, step: int, journal: WorkflowJournal, *, indexed: bool = True) -> RunState:
        """Commit steps until ``step`` of them are (``1``: created, ``2``: running, ``4``: waiting...)."""
        while self.step < step:
            self.advance(journal, indexed=indexed)
        assert self.state is not None
        return self.state


class Child:
    """A child Python process running one :mod:`mayfly_contract._child` mode, line-oriented."""

    def __init__(self, mode: str, **arguments: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mayfly_contract._child", mode, json.dumps(arguments)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def readline(self) -> str:
        """Return the child's next stdout line; fail with its stderr if it ended instead."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AssertionError(f"child exited {self.process.returncode}: {stderr.strip()}")
        return line.strip()

    def send(self, line: str) -> None:
        """Write one line to the child's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def _rest(self) -> tuple[list[str], str]:
        # Read through the same buffered streams readline() used: communicate() would read
        # the raw pipes and lose lines already buffered here.
        out = self.process.stdout.read() if self.process.stdout else ""
        err = self.process.stderr.read() if self.process.stderr else ""
        return out.splitlines(), err

    def finish(self, timeout: float = 120) -> list[str]:
        """Wait for the child to exit successfully and return its remaining stdout lines."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        lines, err = self._rest()
        self.process.wait(timeout=timeout)
        assert self.process.returncode == 0, f"child exited {self.process.returncode}: {err.strip()}"
        return lines

    def kill(self) -> list[str]:
        """SIGKILL the child (no cleanup runs in it), reap it and return what it printed unread."""
        self.process.kill()
        self.process.wait(timeout=30)
        return self._rest()[0]

    def close(self) -> None:
        """Make sure the child is gone."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def sequences(records: Sequence[JournalRecord]) -> list[int]:
    """The sequence numbers of ``records`` in order."""
    return [record.sequence for record in records]


class SlowRelay:
    """The delaying loopback relay (:mod:`mayfly_contract._relay`) in a child process.

    Pass :meth:`address` as the ``relay`` of :meth:`mayfly.journal.NetworkJournal.relayed`;
    :meth:`set_delay` holds every later reply back; :meth:`delivered` counts
    reply bytes, which proves the traffic went through the relay.
    """

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mayfly_contract._relay"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._ports: dict[tuple[str, int], int] = {}

    def _ask(self, command: str) -> str:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            raise AssertionError(f"the relay answered {answer!r} to {command!r}")
        return answer

    def address(self, host: str, port: int) -> tuple[str, int]:
        """Where to connect to reach ``host:port`` through the relay (one local port per upstream)."""
        key = (host, port)
        if key not in self._ports:
            self._ports[key] = int(self._ask(f"relay {host} {port}").split()[1])
        return "127.0.0.1", self._ports[key]

    def set_delay(self, seconds: float) -> None:
        """Hold every later server reply back ``seconds``."""
        self._ask(f"delay {round(seconds * 1000)}")

    def delivered(self) -> int:
        """Reply bytes the relay delivered so far."""
        return int(self._ask("stats").split()[1])

    def close(self) -> None:
        """Stop the relay process."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> Self:
        """Return the running relay."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the relay."""
        self.close()
