"""The ``mayfly`` command: run, watch, signal, cancel, inspect and resume durable workflows.

The exit codes are :data:`EXIT_CODES_HELP` (printed by ``mayfly --help``, documented in docs/cli.md).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO, cast

import msgspec

import mayfly
from mayfly.cli._commands import (
    cmd_backends,
    cmd_cancel,
    cmd_demo,
    cmd_inspect,
    cmd_replay,
    cmd_resume,
    cmd_run,
    cmd_runs,
    cmd_signal,
    cmd_watch,
)
from mayfly.cli._queues import cmd_queue
from mayfly.cli._schedules import ScheduleNotFound, catch_up_choices, cmd_schedule
from mayfly.cli._service import cmd_index, cmd_result, cmd_submit, cmd_worker
from mayfly.cli._support import DEFAULT_JOURNAL, EXIT, Context, Interrupted, UsageError
from mayfly.cli._ui import add_ui_arguments, cmd_ui
from mayfly.inspect import RUN_STATES
from mayfly.model.commands import Rejection
from mayfly.model.errors import (
    BackendNotInstalled,
    CommandRejected,
    CompatibilityError,
    CorruptionError,
    DuplicateRun,
    HandlerUnavailable,
    InvalidBackendURL,
    JournalError,
    LeaseHeld,
    MayflyError,
    PluginError,
    RunNotFound,
    SpecValidationError,
)
from mayfly.plugins import PluginManager, plugin_manager
from mayfly.schedules import ScheduleConflict

__all__ = ["EXIT", "EXIT_CODES_HELP", "build_parser", "entry_point", "main"]

EXIT_CODES_HELP = """\
exit codes:
  0    success: the command did what it was asked; a run ended succeeded
  1    a run ended failed, blocked or cancelled
  2    usage error: arguments, specification, input, handlers module, an ambiguous run-id prefix
  3    the run does not exist in this journal (`mayfly schedule show`: the schedule)
  4    another process owns the run (its recovery lease is held)
  5    journal, backend or history error: no journal at --journal (read-only commands
       create none), an unreachable store, corruption
  6    the run has not ended: it is waiting (for a signal, see `mayfly signal`, or
       a backoff), or `mayfly result` found it still running
  7    `mayfly submit --dedup-id`: a live run of the queue holds that id (nothing created);
       `mayfly schedule add`: a schedule of that name exists (nothing changed; --replace)
  124  `mayfly result --wait --timeout`, `mayfly watch --timeout`: the run neither ended
       nor parked in time
  130  interrupted (Ctrl-C), or a worker aborted by a second SIGTERM/SIGINT

RUN is a run id or a unique prefix of one (01a2c3). Errors are one line on standard
error (with --json: {"error": ..., "exit": N}); --quiet leaves out the hints there.
Colour is used on a terminal only, never with NO_COLOR set."""


class _ArgumentError(Exception):
    """An argument the parser refused; ``main`` prints it as one line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are the CLI's one line, not usage plus a message."""

    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(f"{message}; see `{self.prog} --help`")


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
    parser = _Parser(
        prog="mayfly",
        description="Durable workflows: run, watch, signal, cancel, inspect and resume them.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--journal",
        help=f"journal URL (default: $MAYFLY_JOURNAL or {DEFAULT_JOURNAL}); see `mayfly backends`",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable JSON output")
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no hints on standard error (results and errors only)"
    )
    parser.add_argument("--version", action="version", version=f"mayfly {mayfly.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, fn: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=fn)
        p.add_argument("--journal", default=argparse.SUPPRESS, help="journal URL (overrides the global flag)")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON output")
        p.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no hints on standard error"
        )
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

    p = command(
        "submit", cmd_submit, "create a run of a JSON specification for a worker to drive; print its id"
    )
    p.add_argument("spec", help="path of the workflow specification (JSON)")
    p.add_argument("--input", help="run input as JSON")
    p.add_argument("--queue", default="default", help="the queue workers claim it from (default: default)")
    p.add_argument("--run-id", help="choose the run id (a UUID); submitting an existing id creates nothing")
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="claimed before lower priorities (the queue must enable priorities; default 0)",
    )
    p.add_argument(
        "--dedup-id",
        metavar="ID",
        help="at most one live run of the queue per ID: refused (exit 7) while one lives",
    )

    p = command("worker", cmd_worker, "claim and drive runs from the journal until SIGTERM or SIGINT")
    p.add_argument(
        "--handlers", required=True, help="module name or .py path defining `registry` or `register`"
    )
    p.add_argument("--concurrency", type=_positive, default=16, help="runs driven at once (default 16)")
    p.add_argument(
        "--queue", action="append", default=[], help="serve only this queue (repeat for several; default all)"
    )
    p.add_argument(
        "--poll-interval",
        type=_positive,
        default=1000,
        metavar="MS",
        help="idle poll interval (default 1000 ms)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds in-flight attempts get on stop (default 30)",
    )

    p = command("result", cmd_result, "show a run's result; --wait until it ends or parks")
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument("--wait", action="store_true", help="wait until the run ends or parks on a signal")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds (exit 124)"
    )

    p = command(
        "watch", cmd_watch, "follow a run live, printing each fact as it is committed, until it ends or parks"
    )
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="give up after S seconds (exit 124); default: no limit"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=0.2,
        metavar="S",
        help="how often to read the journal for new facts (default 0.2 s)",
    )

    p = command("index", cmd_index, "maintain the run index workers claim from: `mayfly index rebuild`")
    p.add_argument(
        "action",
        choices=["rebuild"],
        help="rebuild: recompute every run's entry from its history (an old or damaged index)",
    )

    p = command(
        "queue",
        cmd_queue,
        "show or set a queue's flow control: concurrency (global, per worker), rate limit, priorities",
    )
    p.add_argument("action", choices=["set", "show", "list", "remove"], help="what to do")
    p.add_argument("name", nargs="?", help="the queue (not for list)")
    p.add_argument(
        "--concurrency",
        metavar="N",
        help="runs of the queue in progress at once across all workers (or unlimited)",
    )
    p.add_argument(
        "--worker-concurrency",
        metavar="M",
        help="runs of the queue in progress at once in one worker (or unlimited)",
    )
    p.add_argument(
        "--rate", metavar="N/PERIOD", help="starts per period across workers: 10/s, 100/5m (or unlimited)"
    )
    p.add_argument(
        "--priority",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="claim higher-priority submissions first (--no-priority: first come, first served)",
    )
    p.add_argument(
        "--reset", action="store_true", help="with set: start from no limits, then apply the flags"
    )

    p = command(
        "schedule",
        cmd_schedule,
        "durable schedules stored in the journal, served by every worker: add, list, show, remove",
    )
    p.add_argument("action", choices=["add", "list", "show", "remove"], help="what to do")
    p.add_argument("name", nargs="?", help="the schedule (not for list); its runs' ids derive from it")
    p.add_argument("spec", nargs="?", help="with add: the workflow specification file (JSON), stored whole")
    p.add_argument("--every", metavar="DURATION", help="with add: a tick every DURATION (2s, 5m, 1h, 1d)")
    p.add_argument("--offset", metavar="DURATION", help="with --every: ticks shifted by DURATION (default 0)")
    p.add_argument("--cron", metavar="EXPR", help="with add: five-field cron expression, UTC ('0 9 * * 1-5')")
    p.add_argument("--input", help="with add: JSON given to each run as run_input['input']")
    p.add_argument("--queue", default="default", help="with add: the queue its runs go to (default: default)")
    p.add_argument(
        "--catch-up",
        choices=catch_up_choices(),
        help="with add: ticks missed while no worker ran: skip them, start the latest one (default), "
        "or all (at most 1000)",
    )
    p.add_argument("--replace", action="store_true", help="with add: replace a schedule of the same name")

    p = command("runs", cmd_runs, "list runs in the journal")
    p.add_argument("--state", choices=RUN_STATES, help="only runs in this state (running includes waiting)")
    p.add_argument("--workflow", help="only runs of this workflow id")
    p.add_argument("--limit", type=_positive, default=100, help="at most this many runs (default 100)")

    p = command("inspect", cmd_inspect, "show a run: nodes, attempts, blocking reasons, history")
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument("--mermaid", action="store_true", help="print a Mermaid diagram coloured by node state")
    p.add_argument("--history", type=_non_negative, default=200, help="history lines to keep (default 200)")

    p = command("replay", cmd_replay, "replay a run's full history (ignoring snapshots) and compare")
    p.add_argument("run", help="run id (or a unique prefix)")

    p = command("resume", cmd_resume, "take over a run and drive it on (reconciling in-flight attempts)")
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument(
        "--handlers",
        help="module name or .py path with the run's handlers (plugins are always loaded; "
        "a demo run: mayfly.demo)",
    )

    p = command("signal", cmd_signal, "deliver a signal to a waiting node")
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument("node", help="the waiting node")
    p.add_argument("--token", required=True, help="the token the wait was opened with")
    p.add_argument("--decision", required=True, help="a word (approve, reject) or a JSON value")
    p.add_argument(
        "--by", default=os.environ.get("USER", "cli"), help="who decides (recorded with a word decision)"
    )
    p.add_argument("--signal-id", help="idempotency id of this delivery (default: a new UUIDv7)")
    p.add_argument("--name", help="the signal name the node must be waiting for")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="while another process (a worker) owns the run, retry for up to S seconds (default 0: fail)",
    )

    p = command("cancel", cmd_cancel, "cancel a run that no live process owns")
    p.add_argument("run", help="run id (or a unique prefix)")
    p.add_argument("--reason", required=True, help="why (recorded, at most 4 KiB)")
    p.add_argument("--requester", default=os.environ.get("USER", "cli"), help="who cancels")

    command("backends", cmd_backends, "list installed journal and lease backends")

    add_ui_arguments(command("ui", cmd_ui, "serve the read-only web console of the journal"))
    return parser


class _Output(io.TextIOBase):
    """A standard stream that a closed pipe (``mayfly runs | head -1``) silences instead of breaking.

    The first write to a closed pipe sends the stream to ``/dev/null`` and
    sets :attr:`closed_pipe`; the command runs on (a run it drives stays
    consistent) and commands that follow a run stop at their next fact.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream
        self.closed_pipe = False

    def _silence(self) -> None:
        self.closed_pipe = True
        try:
            fileno = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fileno)  # the interpreter's own flush at exit then finds no broken pipe
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._silence()

    def isatty(self) -> bool:
        return not self.closed_pipe and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "failed"


def _failure(err: TextIO, as_json: bool, exit_code: int, message: str) -> int:
    message = _one_line(message)
    if as_json:
        err.write(msgspec.json.encode({"error": message, "exit": exit_code}).decode() + "\n")
    else:
        err.write(f"mayfly: error: {message}\n")
    err.flush()
    return exit_code


def _duration(ms: int) -> str:
    seconds = max(0, ms) / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _lease_message(exc: LeaseHeld, context: Context) -> str:
    """Who holds the run's lease and when it lets go, as far as the backend says."""
    holder = f"held by {exc.holder}" if exc.holder else "held by another process"
    try:
        journal = context.plugins.open_journal(context.journal_url)
        expiry = journal.capabilities.lease_expiry
    except MayflyError:
        expiry = None
    if exc.expires_in_ms is not None:
        until = (
            f"it expires in {_duration(exc.expires_in_ms)} unless its holder renews it "
            "(a live holder does, every third of its ttl)"
        )
    elif expiry is False:
        until = "this backend's leases do not expire: it is held until that process releases it or exits"
    elif expiry:
        until = "it is held until released, or until its ttl passes without a renewal (the holder renews it)"
    else:
        until = "it is held until released or expired"
    return (
        f"run {exc.run_id}: another process owns it (its recovery lease is {holder}); {until} "
        "(a worker lets a run go once only waits are left; signal with --wait SECONDS to retry)"
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    plugins: PluginManager | None = None,
) -> int:
    """Run the CLI; returns the exit code (see :data:`EXIT_CODES_HELP`).

    ``plugins`` is the plugin context every command runs with (backends,
    handlers, spec validators, event upcasters), by default the process's
    entry-point manager.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    guarded_out, guarded_err = _Output(out), _Output(err)
    out, err = cast(TextIO, guarded_out), cast(TextIO, guarded_err)
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    as_json = "--json" in arguments
    try:
        try:
            args = parser.parse_args(arguments)
        except _ArgumentError as exc:
            return _failure(err, as_json, EXIT["usage"], str(exc))
        except SystemExit as exit_:  # --help and --version
            return int(exit_.code or 0)
    finally:
        # argparse prints help on sys.stdout itself: a closed pipe there is silenced too.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _Output(sys.stdout)._silence()
    as_json = bool(args.json)
    context: Context | None = None

    def fail(code: str, message: str) -> int:
        return _failure(err, as_json, EXIT[code], message)

    try:
        context = Context(args, out, err, plugin_manager() if plugins is None else plugins)
        code: int = args.handler(context)
        out.flush()
        return code
    except Interrupted as exc:
        return fail("interrupted", str(exc))
    except KeyboardInterrupt:
        return fail("interrupted", "interrupted")
    except SystemExit as exc:  # never end a command silently with someone else's exit code
        return fail("interrupted", f"stopped by SystemExit({exc.code!r})")
    except (
        UsageError,
        SpecValidationError,
        HandlerUnavailable,
        PluginError,
        InvalidBackendURL,
        BackendNotInstalled,
    ) as exc:
        return fail("usage", str(exc))
    except RunNotFound as exc:
        return fail("not_found", str(exc))
    except ScheduleNotFound as exc:
        return fail("not_found", str(exc))
    except (DuplicateRun, ScheduleConflict) as exc:
        return fail("duplicate", str(exc))
    except LeaseHeld as exc:
        assert context is not None  # raised by a command
        return fail("owned", _lease_message(exc, context))
    except CommandRejected as exc:
        rejection = exc.rejection
        message = str(rejection) if isinstance(rejection, Rejection) else str(exc)
        return fail("usage", message)
    except (JournalError, CorruptionError, CompatibilityError) as exc:
        return fail("journal", str(exc))
    except MayflyError as exc:
        return fail("journal", str(exc))


def entry_point() -> NoReturn:
    """Console-script entry: exit with :func:`main`'s code."""
    raise SystemExit(main())
