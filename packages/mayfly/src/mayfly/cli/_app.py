"""The ``mayfly`` command: run, watch, signal, cancel, inspect and resume durable workflows.

Exit codes (documented in docs/cli.md and ``mayfly --help``):

====  =====================================================================
0     success: the command did what it was asked; a run ended ``succeeded``
1     a run ended ``failed``, ``blocked`` or ``cancelled``
2     usage error, invalid specification, input or handlers module
3     the run does not exist in this journal
4     another process owns the run (its recovery lease is held)
5     journal, backend or history error (unreachable store, corruption, ...)
6     the run is parked, waiting for a signal (see ``mayfly signal``)
130   interrupted (Ctrl-C)
====  =====================================================================
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO, assert_never

import msgspec

import mayfly
from mayfly import demo as demo_module
from mayfly.identity import Uuid7IdSource
from mayfly.inspect import build_inspection, render_mermaid, render_table, to_json
from mayfly.journal import RUN_SUMMARIES, RUN_VERIFICATION
from mayfly.model.commands import Rejection
from mayfly.model.errors import (
    BackendNotInstalled,
    CommandRejected,
    CompatibilityError,
    CorruptionError,
    HandlerUnavailable,
    InvalidBackendURL,
    InvalidIdentifier,
    InvalidJSONValue,
    JournalError,
    LeaseHeld,
    LimitExceeded,
    MayflyError,
    PluginError,
    ResumeRefused,
    RunNotFound,
    SpecDecodeError,
    SpecValidationError,
)
from mayfly.model.events import (
    AttemptDeadlineExpired,
    EdgeActivated,
    Event,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
    RunCompleted,
    RunCreated,
    SignalAccepted,
    SignalExpired,
    SignalRejected,
    SignalWaitOpened,
)
from mayfly.model.ids import parse_run_id
from mayfly.model.limits import MAX_JSON_INT_DIGITS
from mayfly.model.signals import SignalToken
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import list_backends, open_journal, open_leases, plugin_manager
from mayfly.recovery import (
    DispatchReady,
    ReconcileAttempt,
    ReconcileChild,
    RecoveryEffect,
    RestoreRetryTimer,
    RestoreSignalWait,
    inspect_run,
    replay_run,
)
from mayfly.reducer import check_input, ensure_valid
from mayfly.runtime import HandlerRegistry, RunResult, WorkflowRuntime, cancel_run_cascade

__all__ = ["EXIT", "main"]

EXIT = {
    "ok": 0,
    "run_not_succeeded": 1,
    "usage": 2,
    "not_found": 3,
    "owned": 4,
    "journal": 5,
    "waiting": 6,
    "interrupted": 130,
}

DEFAULT_JOURNAL = "file://./.mayfly"


class UsageError(MayflyError):
    """The command line asked for something impossible (exit code 2)."""


class Interrupted(Exception):  # named for its exit code, like KeyboardInterrupt
    """Driving a run was stopped (Ctrl-C, or a handler's SystemExit); the run stays resumable (exit 130)."""


def _driving(args: argparse.Namespace, run_id: str, drive: Callable[[], RunResult]) -> RunResult:
    """Drive a run, turning a stop from Ctrl-C or a handler's ``sys.exit`` into one resumable-run line."""
    try:
        return drive()
    except (KeyboardInterrupt, SystemExit) as exc:
        # The hub re-raises these after stopping: nothing was recorded for the attempt in flight.
        why = (
            "interrupted"
            if isinstance(exc, KeyboardInterrupt)
            else f"a handler raised SystemExit({exc.code!r})"
        )
        raise Interrupted(
            f"{why}; run {run_id} stopped with its attempt in flight; continue it with "
            f"`{_resume_command(args, run_id, getattr(args, 'handlers', None))}`"
        ) from None


def _resume_command(args: argparse.Namespace, run_id: str, handlers: str | None) -> str:
    """The ``mayfly resume`` command line that continues ``run_id`` with the same journal and handlers."""
    url = _journal_url(args)
    flag = "" if url == DEFAULT_JOURNAL else f" --journal '{url}'"
    module = "" if handlers is None else f" --handlers {shlex.quote(handlers)}"
    return f"mayfly{flag} resume {run_id}{module}"


# -- helpers ----------------------------------------------------------------------


def _journal_url(args: argparse.Namespace) -> str:
    return str(args.journal or os.environ.get("MAYFLY_JOURNAL") or DEFAULT_JOURNAL)


def _emit_json(value: object, out: TextIO) -> None:
    out.write(msgspec.json.encode(value).decode() + "\n")


def _registry(handlers: str | None) -> HandlerRegistry:
    """Handlers from installed plugins, plus a module given by name or path (``registry`` or ``register``)."""
    registry = HandlerRegistry()
    plugin_manager().register_handlers(registry)
    if handlers is None:
        return registry
    module = _import_handlers(handlers)
    provided = getattr(module, "registry", None)
    register = getattr(module, "register", None)
    if isinstance(provided, HandlerRegistry):
        for entry in list(provided._entries.values()):  # merge a user's registry into ours
            served = registry.resolve(entry.ref)
            if served is not None and (served.fn, served.cooperative) == (entry.fn, entry.cooperative):
                continue  # the same implementation a plugin already published (e.g. the demo's)
            try:
                registry.register(
                    entry.name,
                    entry.version,
                    entry.fn,
                    compatible_with=entry.compatible - {entry.version},
                    cooperative=entry.cooperative,
                )
            except ValueError as exc:
                raise UsageError(
                    f"handlers module {handlers!r} conflicts with an installed plugin: {exc}"
                ) from None
    elif callable(register):
        try:
            register(registry)
        except Exception as exc:
            raise UsageError(
                f"handlers module {handlers!r}: register(registry) raised {type(exc).__name__}: {exc}"
            ) from None
    else:
        raise UsageError(
            f"handlers module {handlers!r} defines neither `registry` (a HandlerRegistry) "
            "nor `register(registry)`"
        )
    return registry


def _import_handlers(handlers: str) -> Any:
    path = Path(handlers)
    try:
        if path.suffix == ".py" or path.exists():
            # Registered in sys.modules while it runs, as an import would be: dataclasses and
            # msgspec resolve a class's postponed annotations through its module's entry there.
            name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else None
            name = name or f"_mayfly_handlers_{abs(hash(str(path.resolve())))}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise UsageError(f"cannot load handlers from {handlers!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
        return importlib.import_module(handlers)
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:
        raise UsageError(f"cannot import handlers {handlers!r}: {type(exc).__name__}: {exc}") from None


def _load_spec(path: str) -> mayfly.WorkflowSpec:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read specification {path!r}: {exc.strerror}") from None
    try:
        return mayfly.WorkflowSpec.from_json(data)
    except SpecDecodeError as exc:
        raise UsageError(f"specification {path!r} is invalid at {exc.path}: {exc.problem}") from None


def _loads(text: str, what: str) -> Any:
    """``json.loads`` that refuses NaN and infinities: the journal stores JSON, where they become null."""

    def constant(name: str) -> Any:
        raise UsageError(f"{what}: {name} is not a JSON number; durable values must be finite")

    def number(digits: str) -> float:
        value = float(digits)
        if not math.isfinite(value):
            raise UsageError(f"{what}: {digits} is out of range for a JSON number")
        return value

    def integer(digits: str) -> int:
        # int() refuses these itself, with a ValueError that is not a JSONDecodeError.
        if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
            raise UsageError(
                f"{what}: an integer of {len(digits.lstrip('-'))} digits is over the limit of "
                f"{MAX_JSON_INT_DIGITS} digits; pass it as a string"
            )
        return int(digits)

    return json.loads(text, parse_constant=constant, parse_float=number, parse_int=integer)


def _parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return _loads(text, what)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply to decode; pass a flatter JSON value") from None


_WORD = re.compile(r"[^\s\[\]{}\"',:]+")


def _parse_decision(text: str) -> Any:
    """A signal decision: JSON when it decodes as JSON, else a bare word such as ``approve`` or ``no``."""
    try:
        return _loads(text, "--decision")
    except json.JSONDecodeError:
        if _WORD.fullmatch(text):
            return text
    except RecursionError:
        pass
    return _parse_json(text, "--decision")  # raises the one-line usage error


def _run_id(value: str) -> str:
    try:
        return parse_run_id(value)
    except InvalidIdentifier as exc:
        raise UsageError(str(exc)) from None


def _result_code(result: RunResult) -> int:
    if result.status is RunStatus.SUCCEEDED:
        return EXIT["ok"]
    if result.waiting:
        return EXIT["waiting"]
    if result.status.is_terminal:
        return EXIT["run_not_succeeded"]
    return EXIT["waiting"]


def _print_result(result: RunResult, args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        _emit_json(result, out)
        return
    out.write(f"run {result.run_id}: {result.status.value}\n")
    for node_id, summary in result.nodes.items():
        outcome = "-" if summary.outcome is None else summary.outcome.value
        reason = f"  ({summary.reason})" if summary.reason else ""
        out.write(
            f"  {node_id:<16} {summary.status.value:<16} {outcome:<18} attempts={summary.attempts}{reason}\n"
        )
    for node_id, name in result.waiting.items():
        out.write(f"  waiting: node {node_id} for signal {name!r}\n")


# -- progress and timeline ------------------------------------------------------------


class Timeline:
    """Prints committed facts as a readable timeline, or a live progress line for big runs."""

    def __init__(self, out: TextIO, *, verbose: bool, progress: bool) -> None:
        self.out = out
        self.verbose = verbose
        self.progress = progress
        self.start = time.monotonic()
        self._last_progress = 0.0

    def __call__(self, state: RunState, events: tuple[Event, ...]) -> None:
        if self.verbose:
            # Child runs report through the same observer: label them with their parent node.
            prefix = "" if state.parent is None else f"[child of {state.parent.node_id}] "
            for event in events:
                line = describe_event(event)
                if line is not None:
                    self.out.write(f"  {time.monotonic() - self.start:6.2f}s  {prefix}{line}\n")
            self.out.flush()
        elif self.progress:
            now = time.monotonic()
            if now - self._last_progress >= 0.2 or state.status.is_terminal:
                self._last_progress = now
                done = state.open_nodes
                total = len(state.nodes)
                running = [n.node_id for n in state.nodes if n.status is NodeStatus.RUNNING][:3]
                self.out.write(
                    f"\r[{total - done}/{total} nodes done] running: {', '.join(running) or '-'}".ljust(79)
                )
                if state.status.is_terminal:
                    self.out.write("\n")
                self.out.flush()


def describe_effect(effect: RecoveryEffect) -> str:
    """One line for a recovery effect."""
    if isinstance(effect, ReconcileAttempt):
        return (
            f"re-invoking {effect.node_id} attempt {effect.attempt} under its original id "
            f"{effect.attempt_id} (idempotency key {effect.idempotency_key})"
        )
    if isinstance(effect, RestoreSignalWait):
        return f"{effect.node_id} keeps waiting for signal {effect.name!r}"
    if isinstance(effect, RestoreRetryTimer):
        return f"{effect.node_id} retry {effect.next_attempt} due at {effect.deadline} ms"
    if isinstance(effect, DispatchReady):
        return f"dispatching ready nodes: {', '.join(effect.node_ids)}"
    if isinstance(effect, ReconcileChild):
        return f"{effect.node_id} resumes child run {effect.child_run_id} (attempt {effect.attempt_id})"
    assert_never(effect)


def describe_event(event: Event) -> str | None:
    """One payload-free line for a timeline (``None`` for bookkeeping facts)."""
    if isinstance(event, RunCreated):
        return f"run created: {event.spec.workflow_id}@{event.spec.version} ({len(event.spec.nodes)} nodes)"
    if isinstance(event, NodeReady):
        return f"{event.node_id:<10} ready"
    if isinstance(event, EdgeActivated):
        return f"{event.target:<10} activated by {event.source} (correction edge {event.edge})"
    if isinstance(event, NodeStarted):
        return f"{event.node_id:<10} started attempt {event.attempt}"
    if isinstance(event, NodeOutcomeCommitted):
        reason = getattr(event.outcome, "reason", "")
        tail = f": {reason}" if reason else ""
        return f"{event.node_id:<10} {event.outcome.kind.value}{tail}"
    if isinstance(event, NodeFailed):
        return f"{event.node_id:<10} failed ({event.cause.value}: {event.detail})"
    if isinstance(event, RetryScheduled):
        return f"{event.node_id:<10} retry {event.next_attempt} scheduled in {event.delay_ms} ms"
    if isinstance(event, RetryReleased):
        return f"{event.node_id:<10} retry {event.next_attempt} released"
    if isinstance(event, AttemptDeadlineExpired):
        return f"{event.node_id:<10} attempt deadline expired"
    if isinstance(event, SignalWaitOpened):
        return f"{event.node_id:<10} waiting for signal {event.name!r}"
    if isinstance(event, SignalAccepted):
        return f"{event.node_id:<10} signal {event.name!r} accepted"
    if isinstance(event, SignalRejected):
        return f"{event.node_id:<10} signal rejected ({event.reason.value})"
    if isinstance(event, SignalExpired):
        return f"{event.node_id:<10} signal wait {event.name!r} expired"
    if isinstance(event, RunCompleted):
        return f"run {event.result}"
    return None


# -- commands ----------------------------------------------------------------------


def _runtime(args: argparse.Namespace, registry: HandlerRegistry, observer: Any = None) -> WorkflowRuntime:
    url = _journal_url(args)
    return WorkflowRuntime(open_journal(url), registry, leases=open_leases(url), observer=observer)


def _observer(args: argparse.Namespace, out: TextIO, err: TextIO, spec_nodes: int) -> Timeline | None:
    if args.json:
        return None
    verbose = getattr(args, "timeline", False)
    progress = err.isatty() and spec_nodes >= 20
    return Timeline(err if not verbose else out, verbose=verbose, progress=progress)


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly run SPEC --handlers MODULE``."""
    spec = _load_spec(args.spec)
    registry = _registry(args.handlers)
    run_input = _parse_json(args.input, "--input")
    try:
        check_input(run_input, "run input")
    except (LimitExceeded, InvalidJSONValue) as exc:
        raise UsageError(f"--input: {exc}") from None
    # Refused before the journal is opened, so a rejected run leaves no store behind.
    ensure_valid(spec)
    registry.check(spec)
    runtime = _runtime(args, registry, _observer(args, out, err, len(spec.nodes)))
    run_id = runtime.ids.new_id()
    result = _driving(args, run_id, lambda: runtime.execute(spec, run_input, run_id=run_id))
    _print_result(result, args, out)
    return _result_code(result)


def cmd_resume(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly resume RUN``."""
    run_id = _run_id(args.run)
    registry = _registry(args.handlers)
    _install_demo_notifier(err, _journal_url(args))
    runtime = _runtime(args, registry, Timeline(out, verbose=True, progress=False) if not args.json else None)

    def plan(state: RunState, effects: tuple[RecoveryEffect, ...]) -> None:
        # Printed only once this process holds the run: an owned run gets no misleading plan.
        for effect in effects:
            out.write(f"  recovery: {describe_effect(effect)}\n")
        out.flush()

    try:
        result = _driving(
            args, run_id, lambda: runtime.resume(run_id, on_recovery=None if args.json else plan)
        )
    except ResumeRefused as exc:
        # Exit 2: the run is intact and unowned; the same command with the right handlers continues it.
        given = (
            "no --handlers module was given"
            if args.handlers is None
            else f"the handlers module {args.handlers!r} does not serve them"
        )
        raise UsageError(
            f"{exc}; {given}: continue with `{_resume_command(args, run_id, 'MODULE')}`, where MODULE "
            "registers them (installed plugins are always loaded)"
        ) from None
    _print_result(result, args, out)
    return _result_code(result)


def cmd_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly runs [--state S] [--workflow W]``."""
    journal = open_journal(_journal_url(args))
    rows: list[dict[str, Any]] = []
    for page in _candidate_pages(journal, args):
        if len(rows) >= args.limit:
            break
        for run_id in page:
            try:
                state = inspect_run(journal, run_id).state
            except (JournalError, CorruptionError, CompatibilityError) as exc:
                # One unreadable history must not hide every other run; `inspect` explains it.
                if not (args.state or args.workflow):
                    rows.append(_unreadable_row(run_id, exc))
                continue
            # "waiting" is not a run status: a waiting run is running, parked on a signal.
            wanted = RunStatus.RUNNING.value if args.state == "waiting" else args.state
            if wanted and state.status.value != wanted:
                continue
            if args.state == "waiting" and not any(n.wait is not None for n in state.nodes):
                continue
            if args.workflow and state.spec.workflow_id != args.workflow:
                continue
            waiting = ",".join(n.node_id for n in state.nodes if n.wait is not None)
            rows.append(
                {
                    "run_id": run_id,
                    "workflow": f"{state.spec.workflow_id}@{state.spec.version}",
                    "status": "waiting" if waiting and not state.status.is_terminal else state.status.value,
                    "nodes_done": len(state.nodes) - state.open_nodes,
                    "nodes": len(state.nodes),
                    "waiting_on": waiting,
                }
            )
            if len(rows) >= args.limit:
                break
    if args.json:
        _emit_json(rows, out)
        return EXIT["ok"]
    if not rows:
        out.write("no runs\n")
        return EXIT["ok"]
    out.write(f"{'RUN':<36}  {'WORKFLOW':<30}  {'STATUS':<10}  NODES\n")
    for r in rows:
        extra = f"  waiting on {r['waiting_on']}" if r["waiting_on"] else ""
        if "error" in r:
            extra = f"  {r['error']}"
        done = f"{r['nodes_done']}/{r['nodes']}"
        out.write(f"{r['run_id']:<36}  {r['workflow']:<30}  {r['status']:<10}  {done}{extra}\n")
    return EXIT["ok"]


def _candidate_pages(journal: Any, args: argparse.Namespace) -> Iterator[list[str]]:
    """Pages of run ids to inspect for ``mayfly runs``.

    A backend that keeps an indexed run summary (``run_summaries``, e.g.
    PostgreSQL) preselects the most recently updated runs matching the
    filters, so listing costs O(--limit) inspections however many runs exist;
    otherwise every run is paged through in id order. "waiting" is not indexed
    (it is a running run parked on a signal), so it always pages.
    """
    summaries = RUN_SUMMARIES.of(journal)
    if summaries is not None and args.state != "waiting":
        found = summaries.run_summaries(
            status=args.state, workflow_id=args.workflow, limit=min(args.limit, 1000)
        )
        yield [summary.run_id for summary in found]
        return
    after = None
    while True:
        page = journal.list_runs(after=after, limit=min(1000, args.limit * 4))
        if not page:
            return
        after = page[-1]
        yield page


def _unreadable_row(run_id: str, exc: Exception) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "workflow": "?",
        "status": "unreadable",
        "nodes_done": 0,
        "nodes": 0,
        "waiting_on": "",
        "error": str(exc),
    }


def cmd_inspect(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly inspect RUN [--json | --mermaid]``."""
    if args.mermaid and args.json:
        raise UsageError("--json and --mermaid are exclusive: pick JSON or a Mermaid diagram")
    url = _journal_url(args)
    journal = open_journal(url)
    run_id = _run_id(args.run)
    recovered = inspect_run(journal, run_id)
    records = journal.read(run_id, after=max(recovered.state.sequence - args.history, 0))
    inspection = build_inspection(recovered, records, args.history, journal_url=journal.url)
    if args.mermaid:
        out.write(render_mermaid(inspection, recovered.state.spec) + "\n")
    elif args.json:
        out.write(to_json(inspection).decode() + "\n")
    else:
        out.write(render_table(inspection) + "\n")
    return EXIT["ok"]


def cmd_replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly replay RUN``: reduce the full history, ignoring snapshots, and compare."""
    journal = open_journal(_journal_url(args))
    run_id = _run_id(args.run)
    started = time.monotonic()
    verifier = RUN_VERIFICATION.of(journal)
    if verifier is not None:
        verifier.verify_run(run_id)  # a backend that can check every stored frame does so before the replay
    full = replay_run(journal, run_id)
    elapsed = time.monotonic() - started
    cached = inspect_run(journal, run_id)
    same = msgspec.json.encode(full.state.to_record()) == msgspec.json.encode(cached.state.to_record())
    report = {
        "run_id": run_id,
        "status": full.state.status.value,
        "events": full.records_reduced,
        "seconds": round(elapsed, 6),
        "snapshot_agrees": same,
        "snapshot_source": cached.source,
        "diagnostics": list(cached.diagnostics),
    }
    if args.json:
        _emit_json(report, out)
    else:
        out.write(
            f"run {run_id}: replayed {full.records_reduced} events in {elapsed * 1000:.1f} ms; "
            f"status {full.state.status.value}; snapshot {'agrees' if same else 'DISAGREES'} "
            f"(inspection used {cached.source})\n"
        )
        for diagnostic in cached.diagnostics:
            out.write(f"  {diagnostic}\n")
    return EXIT["ok"] if same else EXIT["journal"]


def cmd_signal(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly signal RUN NODE --token T --decision JSON``."""
    run_id = _run_id(args.run)
    runtime = _runtime(args, HandlerRegistry())
    decision = _parse_decision(args.decision)
    if isinstance(decision, str):
        decision = {"decision": decision, "by": args.by}
    elif isinstance(decision, dict):
        decision.setdefault("by", args.by)
    try:
        token = SignalToken(args.token)
    except ValueError as exc:
        raise UsageError(f"--token: {exc}") from None
    disposition = runtime.signal(run_id, args.node, token, decision, signal_id=args.signal_id, name=args.name)
    if args.json:
        _emit_json(disposition, out)
    else:
        out.write(f"signal {disposition.signal_id} to {args.node}: {disposition.status}")
        out.write(f" ({disposition.reason})\n" if disposition.reason else "\n")
        if disposition.status == "accepted":
            out.write(f"next: mayfly resume {run_id}\n")
    return EXIT["ok"] if disposition.status != "rejected" else EXIT["usage"]


def cmd_cancel(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly cancel RUN --reason R``: cancel a run and its open child runs."""
    url = _journal_url(args)
    journal, leases = open_journal(url), open_leases(url)
    run_id = _run_id(args.run)
    before = inspect_run(journal, run_id).state
    if before.status.is_terminal:
        raise UsageError(
            f"run_terminal: run {run_id} already {before.status.value}; it accepts no more commands"
        )
    cancel_run_cascade(
        journal,
        leases,
        run_id,
        requester=args.requester,
        reason=args.reason,
        owner=f"mayfly-cli:{os.getpid()}",
        ids=Uuid7IdSource(),
    )
    state = inspect_run(journal, run_id).state
    report = {"run_id": run_id, "status": state.status.value}
    if args.json:
        _emit_json(report, out)
    else:
        out.write(f"run {run_id}: {state.status.value}\n")
    return EXIT["ok"]


def cmd_backends(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly backends``."""
    url = args.journal or os.environ.get("MAYFLY_JOURNAL")
    infos = list_backends(url)
    if args.json:
        _emit_json(
            [
                {
                    "kind": b.kind,
                    "scheme": b.scheme,
                    "distribution": b.distribution,
                    "plugin": b.plugin,
                    "description": b.description,
                }
                for b in infos
            ],
            out,
        )
        return EXIT["ok"]
    for b in infos:
        out.write(f"{b.kind:<8} {b.scheme + '://':<14} {b.distribution:<18} {b.description}\n")
    return EXIT["ok"]


def _install_demo_notifier(err: TextIO, journal_url: str, tokens: dict[str, str] | None = None) -> None:
    journal_flag = "" if journal_url == DEFAULT_JOURNAL else f" --journal '{journal_url}'"

    def notify(run_id: str, node_id: str, token: str) -> None:
        if tokens is not None:
            tokens[run_id] = token
            return
        err.write(
            f"\napproval requested for run {run_id}. Approve it with:\n"
            f"  mayfly{journal_flag} signal {run_id} {node_id} --token {token} --decision approve\n"
            f"then continue it with:\n  mayfly{journal_flag} resume {run_id}\n\n"
        )
        err.flush()

    demo_module.set_approval_notifier(notify)


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``mayfly demo [--auto-approve] [--crash-at NODE]``: the code-review pipeline, end to end."""
    url = _journal_url(args)
    registry = _registry(None)
    if registry.resolve("demo.plan@1") is None:
        demo_module.register_demo_handlers(registry)
    tokens: dict[str, str] = {}
    _install_demo_notifier(err, url, tokens if args.auto_approve else None)
    if args.crash_at:
        if args.crash_at not in {n.id for n in demo_module.DEMO_SPEC.nodes} - {"approval"}:
            raise UsageError(f"--crash-at must name a demo node other than approval, got {args.crash_at!r}")
        demo_module.crash_at(args.crash_at)
    timeline = None if args.json else Timeline(out, verbose=True, progress=False)
    runtime = _runtime(args, registry, timeline)
    run_id = runtime.ids.new_id()
    journal_flag = "" if url == DEFAULT_JOURNAL else f" --journal '{url}'"
    if not args.json:
        out.write(f"mayfly demo: code-review pipeline, run {run_id}\njournal: {url}\n")
        if args.crash_at:
            out.write(
                f"this process will be killed (SIGKILL) when {args.crash_at!r} starts; "
                f"continue afterwards with:\n  mayfly{journal_flag} resume {run_id}\n"
            )
        out.write("\n")
        out.flush()
    elif args.crash_at:
        # Standard output stays pure JSON, and this process dies before printing any: say the run id here.
        err.write(
            f"mayfly demo: run {run_id} will be killed at {args.crash_at!r}; then: "
            f"mayfly{journal_flag} resume {run_id}\n"
        )
        err.flush()
    result = _driving(
        args, run_id, lambda: runtime.execute(demo_module.DEMO_SPEC, {"requested_by": "demo"}, run_id=run_id)
    )
    if args.auto_approve and result.waiting:
        token = tokens[run_id]
        if not args.json:
            out.write(
                f"  {time.monotonic() - timeline.start if timeline else 0:6.2f}s  "
                "run parked durably; approving it (--auto-approve) and resuming\n"
            )
        runtime.signal(run_id, "approval", token, {"decision": "approve", "by": "mayfly demo --auto-approve"})
        result = _driving(args, run_id, lambda: runtime.resume(run_id))
    if args.json:
        _emit_json(result, out)
    else:
        journal = runtime.journal
        recovered = inspect_run(journal, run_id)
        inspection = build_inspection(recovered, journal.read(run_id), journal_url=journal.url)
        out.write("\n" + render_table(inspection) + "\n")
        if result.waiting:
            out.write("\nthe run is parked waiting for approval; see the `mayfly signal` command above.\n")
    return _result_code(result)


# -- argument parsing --------------------------------------------------------------


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI)."""
    parser = argparse.ArgumentParser(
        prog="mayfly",
        description="Durable workflows: run, watch, signal, cancel, inspect and resume them.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--journal",
        help=f"journal URL (default: $MAYFLY_JOURNAL or {DEFAULT_JOURNAL}); see `mayfly backends`",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable JSON output")
    parser.add_argument("--version", action="version", version=f"mayfly {mayfly.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, fn: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=fn)
        p.add_argument("--journal", default=argparse.SUPPRESS, help="journal URL (overrides the global flag)")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON output")
        return p

    p = command("demo", cmd_demo, "run the code-review demo pipeline on the embedded journal")
    p.add_argument(
        "--auto-approve", action="store_true", help="approve the human approval step automatically"
    )
    p.add_argument("--crash-at", metavar="NODE", help="kill this process (SIGKILL) when NODE starts")

    p = command("run", cmd_run, "create a run of a JSON workflow specification and drive it")
    p.add_argument("spec", help="path of the workflow specification (JSON)")
    p.add_argument(
        "--handlers", required=True, help="module name or .py path defining `registry` or `register`"
    )
    p.add_argument("--input", help="run input as JSON")
    p.add_argument("--timeline", action="store_true", help="print every committed fact as it happens")

    p = command("runs", cmd_runs, "list runs in the journal")
    p.add_argument(
        "--state", choices=[s.value for s in RunStatus] + ["waiting"], help="only runs in this state"
    )
    p.add_argument("--workflow", help="only runs of this workflow id")
    p.add_argument("--limit", type=_positive, default=100, help="at most this many runs (default 100)")

    p = command("inspect", cmd_inspect, "show a run: nodes, attempts, blocking reasons, history")
    p.add_argument("run", help="run id")
    p.add_argument("--mermaid", action="store_true", help="print a Mermaid diagram coloured by node state")
    p.add_argument("--history", type=_non_negative, default=200, help="history lines to keep (default 200)")

    p = command("replay", cmd_replay, "replay a run's full history (ignoring snapshots) and compare")
    p.add_argument("run", help="run id")

    p = command("resume", cmd_resume, "take over a run and drive it on (reconciling in-flight attempts)")
    p.add_argument("run", help="run id")
    p.add_argument(
        "--handlers", help="module name or .py path with the run's handlers (plugins are always loaded)"
    )

    p = command("signal", cmd_signal, "deliver a signal to a waiting node")
    p.add_argument("run", help="run id")
    p.add_argument("node", help="the waiting node")
    p.add_argument("--token", required=True, help="the token the wait was opened with")
    p.add_argument("--decision", required=True, help="a word (approve, reject) or a JSON value")
    p.add_argument(
        "--by", default=os.environ.get("USER", "cli"), help="who decides (recorded with a word decision)"
    )
    p.add_argument("--signal-id", help="idempotency id of this delivery (default: a new UUIDv7)")
    p.add_argument("--name", help="the signal name the node must be waiting for")

    p = command("cancel", cmd_cancel, "cancel a run that no live process owns")
    p.add_argument("run", help="run id")
    p.add_argument("--reason", required=True, help="why (recorded, at most 4 KiB)")
    p.add_argument("--requester", default=os.environ.get("USER", "cli"), help="who cancels")

    command("backends", cmd_backends, "list installed journal and lease backends")
    return parser


def _fail(err: TextIO, code: str, message: str) -> int:
    err.write(f"mayfly: error: {message}\n")
    return EXIT[code]


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (see the module docstring)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        code: int = args.handler(args, out, err)
        return code
    except Interrupted as exc:
        return _fail(err, "interrupted", str(exc))
    except KeyboardInterrupt:
        return _fail(err, "interrupted", "interrupted")
    except SystemExit as exc:  # never end a command silently with someone else's exit code
        return _fail(err, "interrupted", f"stopped by SystemExit({exc.code!r})")
    except (
        UsageError,
        SpecValidationError,
        HandlerUnavailable,
        PluginError,
        InvalidBackendURL,
        BackendNotInstalled,
    ) as exc:
        return _fail(err, "usage", str(exc))
    except RunNotFound as exc:
        return _fail(err, "not_found", str(exc))
    except LeaseHeld as exc:
        return _fail(err, "owned", f"{exc}; another process owns it until it releases or its lease expires")
    except CommandRejected as exc:
        rejection = exc.rejection
        message = str(rejection) if isinstance(rejection, Rejection) else str(exc)
        return _fail(err, "usage", message)
    except (JournalError, CorruptionError, CompatibilityError) as exc:
        return _fail(err, "journal", str(exc))
    except MayflyError as exc:
        return _fail(err, "journal", str(exc))


def entry_point() -> NoReturn:
    """Console-script entry: exit with :func:`main`'s code."""
    raise SystemExit(main())
