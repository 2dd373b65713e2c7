"""What every command shares: its context, exit codes, argument parsing helpers and output."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, assert_never, final

import msgspec

from mayfly.inspect import WAITING, journal_children, narrate, run_status, wake_at_ms
from mayfly.inspect.render import duration, wall_time
from mayfly.journal import WorkflowJournal
from mayfly.model.errors import (
    InvalidIdentifier,
    InvalidRecord,
    JournalUnavailable,
    MayflyError,
    RunNotFound,
    SpecDecodeError,
)
from mayfly.model.events import Event
from mayfly.model.ids import is_uuid, parse_run_id
from mayfly.model.limits import MAX_JSON_INT_DIGITS
from mayfly.model.spec import WorkflowSpec
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import PluginManager
from mayfly.recovery import (
    DispatchReady,
    ReconcileAttempt,
    ReconcileChild,
    RecoveryEffect,
    RestoreRetryTimer,
    RestoreSignalWait,
)
from mayfly.runtime import HandlerRegistry, RunResult, WorkflowRuntime
from mayfly.schedules import Schedule, check_schedules

EXIT = {
    "ok": 0,
    "run_not_succeeded": 1,
    "usage": 2,
    "not_found": 3,
    "owned": 4,
    "journal": 5,
    "waiting": 6,
    "duplicate": 7,
    "timeout": 124,
    "interrupted": 130,
}

DEFAULT_JOURNAL = "file://./.mayfly"


class UsageError(MayflyError):
    """The command line asked for something impossible (exit code 2)."""


class AmbiguousRun(UsageError):
    """A run-id prefix matches more than one run (exit code 2); the message lists them."""


class Interrupted(Exception):  # named for its exit code, like KeyboardInterrupt
    """Driving a run was stopped (Ctrl-C, or a handler's SystemExit); the run stays resumable (exit 130)."""


@final
@dataclass(frozen=True, slots=True)
class Context:
    """What one command runs with: its parsed arguments, its output streams and the plugin context."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO
    plugins: PluginManager

    @property
    def journal_url(self) -> str:
        """The journal URL: ``--journal``, else ``$MAYFLY_JOURNAL``, else the embedded default."""
        return str(self.args.journal or os.environ.get("MAYFLY_JOURNAL") or DEFAULT_JOURNAL)

    @property
    def journal_flag(self) -> str:
        """The ``--journal`` flag a printed command needs for this journal (empty for the default)."""
        url = self.journal_url
        return "" if url == DEFAULT_JOURNAL else f" --journal {shlex.quote(url)}"

    @property
    def json(self) -> bool:
        """Whether ``--json`` was given."""
        return bool(getattr(self.args, "json", False))

    @property
    def quiet(self) -> bool:
        """Whether ``--quiet`` was given: no hints on standard error."""
        return bool(getattr(self.args, "quiet", False))

    @property
    def mayfly(self) -> str:
        """How printed commands start: the command line that runs this same mayfly, with its journal."""
        return f"{invoked_command()}{self.journal_flag}"

    def hint(self, text: str) -> None:
        """Write a hint (what to run next) on standard error, unless ``--quiet``."""
        if not self.quiet:
            self.err.write(text if text.endswith("\n") else text + "\n")
            self.err.flush()

    def require_journal(self) -> None:
        """Refuse, creating nothing, when no journal is at the URL (read-only commands; exit 5).

        A backend that cannot tell (it declares no ``exists``) is opened as before.
        """
        url = self.journal_url
        if self.plugins.journal_exists(url) is False:
            raise JournalUnavailable(
                f"no journal at {url}; check --journal or $MAYFLY_JOURNAL (this command creates none; "
                "`mayfly run`, `submit` and `demo` create one)"
            )

    def open_journal(self) -> WorkflowJournal:
        """The existing journal of a read-only command (see :meth:`require_journal`)."""
        self.require_journal()
        return self.plugins.open_journal(self.journal_url)

    def runtime(self, registry: HandlerRegistry | None = None, observer: Any = None) -> WorkflowRuntime:
        """A runtime on this command's journal, built with its plugin context."""
        return WorkflowRuntime(self.journal_url, registry, plugins=self.plugins, observer=observer)

    def resume_command(self, run_id: str, handlers: str | None) -> str:
        """The ``mayfly resume`` command line that continues ``run_id`` with the same journal and handlers."""
        module = "" if handlers is None else f" --handlers {shlex.quote(handlers)}"
        return f"{self.mayfly} resume {run_id}{module}"

    def emit_json(self, value: object) -> None:
        """Write ``value`` as one JSON document on standard output."""
        self.out.write(msgspec.json.encode(value).decode() + "\n")


_STATUS_COLOURS = {
    "succeeded": "32",
    "failed": "31",
    "unreadable": "31",
    "blocked": "33",
    "waiting": "33",
    "cancelled": "35",
    "running": "36",
}


def colour_enabled(stream: TextIO) -> bool:
    """Colour only on a terminal, never with ``NO_COLOR`` set (https://no-color.org) or ``TERM=dumb``."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or minimal stream
        return False


def paint(ctx: Context, text: str, status: str) -> str:
    """``text`` coloured for the run or node ``status`` when standard output is a colour terminal."""
    code = _STATUS_COLOURS.get(status)
    if code is None or ctx.json or not colour_enabled(ctx.out):
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


def invoked_command() -> str:
    """The command line that runs this mayfly again, to start the commands it prints.

    ``mayfly`` when that name on ``PATH`` is this very program; otherwise the
    path the user invoked (a console script given by path, e.g.
    ``.venv/bin/mayfly``), or ``PYTHON -m mayfly`` with this interpreter's path.
    """
    on_path = shutil.which("mayfly")
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name = Path(argv0).name
    if name == "__main__.py" or argv0 == "-m":
        # python -m mayfly: `mayfly` is the same program when it sits beside this interpreter.
        if on_path is not None and Path(on_path).absolute().parent == Path(sys.executable).absolute().parent:
            return "mayfly"
        return f"{shlex.quote(sys.executable)} -m mayfly"
    if name.startswith("mayfly"):  # the console script (or a wrapper named for it)
        if on_path is not None and os.path.realpath(on_path) == os.path.realpath(argv0):
            return "mayfly"
        return shlex.quote(os.path.abspath(argv0))
    # Embedded (main() called from Python): the installed command if there is one.
    return "mayfly" if on_path is not None else f"{shlex.quote(sys.executable)} -m mayfly"


def driving(ctx: Context, run_id: str, handlers: str | None, drive: Callable[[], RunResult]) -> RunResult:
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
            f"`{ctx.resume_command(run_id, handlers)}`"
        ) from None


# -- handlers, specifications and JSON values ------------------------------------------


def handler_registry(ctx: Context, handlers: str | None) -> HandlerRegistry:
    """Handlers from the plugins, plus a module given by name or path (``registry`` or ``register``)."""
    registry = HandlerRegistry()
    ctx.plugins.register_handlers(registry)
    if handlers is None:
        return registry
    module = _LOADED[handlers] = _import_handlers(handlers)
    provided = getattr(module, "registry", None)
    register = getattr(module, "register", None)
    if isinstance(provided, HandlerRegistry):
        for entry in list(provided._entries.values()):  # merge a user's registry into ours
            served = registry.resolve(entry.ref)
            if served is not None and (served.fn, served.cooperative) == (entry.fn, entry.cooperative):
                continue  # the same implementation a plugin already published
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


_LOADED: dict[str, Any] = {}


def handlers_schedules(handlers: str) -> tuple[Schedule, ...]:
    """The ``schedules`` of a handlers module :func:`handler_registry` loaded (none if it has none)."""
    found = getattr(_LOADED.get(handlers), "schedules", ())
    try:
        return check_schedules(list(found))
    except (InvalidRecord, TypeError) as exc:
        raise UsageError(f"handlers module {handlers!r}: schedules: {exc}") from None


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


def load_spec(path: str) -> WorkflowSpec:
    """Read and decode a JSON specification file; a bad file is one usage line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read specification {path!r}: {exc.strerror}") from None
    try:
        return WorkflowSpec.from_json(data)
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


def parse_json(text: str | list[str] | None, what: str) -> Any:
    """Decode a JSON argument (``None`` stays ``None``); bad JSON is one usage line naming ``what``."""
    if text is None:
        return None
    if not isinstance(text, str):
        # Python 3.11's argparse drops a "--" from an option's value, so `--input=--` arrives as [].
        raise UsageError(f"{what} is not valid JSON: got '--'")
    try:
        return _loads(text, what)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply to decode; pass a flatter JSON value") from None


_WORD = re.compile(r"[^\s\[\]{}\"',:]+")


def parse_decision(text: str | list[str]) -> Any:
    """A signal decision: JSON when it decodes as JSON, else a bare word such as ``approve`` or ``no``."""
    if not isinstance(text, str):
        return parse_json(text, "--decision")  # argparse's [] for `--decision=--`: the usage error
    try:
        return _loads(text, "--decision")
    except json.JSONDecodeError:
        if _WORD.fullmatch(text):
            return text
    except RecursionError:
        pass
    return parse_json(text, "--decision")  # raises the one-line usage error


def run_id_argument(value: str) -> str:
    """A run id from the command line; a malformed one is a usage error."""
    try:
        return parse_run_id(value)
    except InvalidIdentifier as exc:
        raise UsageError(str(exc)) from None


_PREFIX = re.compile(r"[0-9a-f-]{1,36}")
_LISTED_MATCHES = 10
_PAGE = 1_000


def resolve_run(journal: WorkflowJournal, value: str) -> str:
    """The run a RUN argument names: a whole run id, or a prefix of exactly one run's id.

    A trailing ``…`` or ``...`` (as the docs abbreviate ids) is ignored. A
    prefix that matches no run raises :class:`RunNotFound` (exit 3); one that
    matches several is a usage error listing them (exit 2).
    """
    text = value.strip().lower().removesuffix("…").removesuffix("...")
    if is_uuid(text):
        return text
    if _PREFIX.fullmatch(text) is None:
        raise UsageError(
            f"run {value!r}: expected a run id or a unique prefix of one (hex digits and dashes)"
        )
    matches = _runs_with_prefix(journal, text, _LISTED_MATCHES + 1)
    if not matches:
        raise RunNotFound(f"{text}…")
    if len(matches) > 1:
        shown = ", ".join(matches[:_LISTED_MATCHES])
        more = " and more" if len(matches) > _LISTED_MATCHES else ""
        raise AmbiguousRun(f"run prefix {text!r} matches several runs: {shown}{more}; give more of the id")
    return matches[0]


def _runs_with_prefix(journal: WorkflowJournal, prefix: str, limit: int) -> list[str]:
    # Run ids list in sorted order: start just below the smallest id with the prefix, stop past it.
    digits = prefix.replace("-", "")
    if len(digits) > 32:
        return []
    floor = int(digits.ljust(32, "0"), 16) if digits else 0
    after = None if floor == 0 else str(uuid.UUID(int=floor - 1))
    found: list[str] = []
    while True:
        page = journal.list_runs(after=after, limit=_PAGE)
        if not page:
            return found
        for run_id in page:
            if run_id.startswith(prefix):
                found.append(run_id)
                if len(found) >= limit:
                    return found
            elif run_id > prefix:
                return found
        after = page[-1]


_SIGNAL_ID = re.compile(r"[\x21-\x7e]{1,200}")
SIGNAL_ID_NAMESPACE = uuid.UUID("5f0c2b7e-8d4a-4c1e-9a63-6d2f1b0e7a41")
"""The UUIDv5 namespace a chosen ``--signal-id`` that is not a UUID is mapped in."""


def signal_id_argument(value: str) -> str:
    """The journal's signal id for ``--signal-id``: a UUID as given, any other id mapped to a UUIDv5.

    The mapping is deterministic, so the same chosen id (``deploy-42``) is
    the same delivery every time, and a retry is idempotent.
    """
    text = value.strip()
    if is_uuid(text.lower()):
        return text.lower()
    if _SIGNAL_ID.fullmatch(text) is None:
        raise UsageError(
            f"--signal-id {value!r}: expected 1 to 200 printable characters without spaces, or a UUID"
        )
    return str(uuid.uuid5(SIGNAL_ID_NAMESPACE, text))


# -- results, progress and the timeline ------------------------------------------------


def result_code(result: RunResult) -> int:
    """The exit code a driven run's result maps to."""
    if result.status is RunStatus.SUCCEEDED:
        return EXIT["ok"]
    if result.waiting:
        return EXIT["waiting"]
    if result.status.is_terminal:
        return EXIT["run_not_succeeded"]
    return EXIT["waiting"]


def status_of(runtime: WorkflowRuntime, state: RunState) -> str:
    """The run's status word, the one every command shows (:func:`mayfly.inspect.run_status`).

    ``waiting`` for a running run that can only wait: for a signal, a
    backoff or a deadline, or for child runs (read from the journal) that wait.
    """
    return run_status(state, journal_children(runtime.journal, runtime.upcasters))


FOLLOW_TIMERS_MS = 1_000
"""A timer due within this long is slept through, as a worker does before parking (its default poll)."""


def timer_wait(state: RunState, word: str) -> int | None:
    """When a run that waits only for a timer further away than a second wakes (wall ms), else ``None``.

    Such a run is parked as a worker parks it: `watch` stops following it, and
    `resume` does not take it over only to sleep until then.
    """
    if word != WAITING or state.waiting_count:
        return None
    wake = wake_at_ms(state)
    if wake is None or wake - int(time.time() * 1000) <= FOLLOW_TIMERS_MS:
        return None
    return wake


def print_result(ctx: Context, runtime: WorkflowRuntime, result: RunResult) -> None:
    """Print a run's result: JSON with ``--json``, else one line per node and per wait.

    The status is the run's status word (``waiting``, ``running`` or the terminal
    status), read from the journal as it is now: the same word in every command.
    """
    state = runtime.inspect(result.run_id).state
    word = status_of(runtime, state)
    if ctx.args.json:
        document = msgspec.to_builtins(result)
        document["status"] = word
        ctx.emit_json(document)
        return
    out = ctx.out
    out.write(f"run {result.run_id}: {paint(ctx, word, word)}\n")
    for node_id, summary in result.nodes.items():
        outcome = "-" if summary.outcome is None else summary.outcome.value
        reason = f"  ({summary.reason})" if summary.reason else ""
        out.write(
            f"  {node_id:<16} {summary.status.value:<16} {outcome:<18} attempts={summary.attempts}{reason}\n"
        )
    for node_id, name in result.waiting.items():
        out.write(f"  waiting: node {node_id} for signal {name!r}\n")
    if word == WAITING:
        for index, deadline in sorted(state.pending_retries(), key=lambda retry: retry[1]):
            node = state.node(index)
            when = _when(state, deadline)
            out.write(f"  waiting: node {node.node_id} to retry (attempt {node.attempt + 1}) {when}\n")


def when_text(wall_ms: int) -> str:
    """A wall-clock time as a person reads it: ``at 2026-12-08T13:21:15.908Z (in 7d)``."""
    left = wall_ms - int(time.time() * 1000)
    return f"at {wall_time(wall_ms)} ({f'in {duration(left)}' if left > 0 else 'due now'})"


def _when(state: RunState, deadline: int) -> str:
    # A run recorded before epochs has only virtual milliseconds.
    return f"at {deadline} ms" if state.epoch_ms is None else when_text(state.epoch_ms + deadline)


def _flat(text: str) -> str:
    # Reasons are free text: keep each timeline entry on one printable line.
    return "".join(ch if ch.isprintable() else " " for ch in text)


def timeline_line(event: Event) -> str | None:
    """The event's narration as a timeline entry (``None`` for bookkeeping facts such as time advancing)."""
    narration = narrate(event)
    if narration.bookkeeping:
        return None
    line = narration.line if narration.subject is None else f"{narration.subject:<10} {narration.text}"
    return f"{line}: {_flat(narration.reason)}" if narration.reason else line


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
                line = timeline_line(event)
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
