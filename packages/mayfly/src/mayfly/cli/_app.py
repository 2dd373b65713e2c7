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
124   ``mayfly result --wait --timeout``: the run neither ended nor parked in time
130   interrupted (Ctrl-C), or a worker aborted by a second SIGTERM/SIGINT
====  =====================================================================
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

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
)
from mayfly.cli._service import cmd_index, cmd_result, cmd_submit, cmd_worker
from mayfly.cli._support import DEFAULT_JOURNAL, EXIT, Context, Interrupted, UsageError
from mayfly.inspect import RUN_STATES
from mayfly.model.commands import Rejection
from mayfly.model.errors import (
    BackendNotInstalled,
    CommandRejected,
    CompatibilityError,
    CorruptionError,
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

__all__ = ["EXIT", "build_parser", "entry_point", "main"]


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

    p = command(
        "submit", cmd_submit, "create a run of a JSON specification for a worker to drive; print its id"
    )
    p.add_argument("spec", help="path of the workflow specification (JSON)")
    p.add_argument("--input", help="run input as JSON")
    p.add_argument("--queue", default="default", help="the queue workers claim it from (default: default)")
    p.add_argument("--run-id", help="choose the run id (a UUID); submitting an existing id creates nothing")

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
    p.add_argument("run", help="run id")
    p.add_argument("--wait", action="store_true", help="wait until the run ends or parks on a signal")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds (exit 124)"
    )

    p = command("index", cmd_index, "maintain the run index workers claim from: `mayfly index rebuild`")
    p.add_argument(
        "action",
        choices=["rebuild"],
        help="rebuild: recompute every run's entry from its history (an old or damaged index)",
    )

    p = command("runs", cmd_runs, "list runs in the journal")
    p.add_argument("--state", choices=RUN_STATES, help="only runs in this state (running includes waiting)")
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
        "--handlers",
        help="module name or .py path with the run's handlers (plugins are always loaded; "
        "a demo run: mayfly.demo)",
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
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="while another process (a worker) owns the run, retry for up to S seconds (default 0: fail)",
    )

    p = command("cancel", cmd_cancel, "cancel a run that no live process owns")
    p.add_argument("run", help="run id")
    p.add_argument("--reason", required=True, help="why (recorded, at most 4 KiB)")
    p.add_argument("--requester", default=os.environ.get("USER", "cli"), help="who cancels")

    command("backends", cmd_backends, "list installed journal and lease backends")
    return parser


def _fail(err: TextIO, code: str, message: str) -> int:
    err.write(f"mayfly: error: {message}\n")
    return EXIT[code]


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    plugins: PluginManager | None = None,
) -> int:
    """Run the CLI; returns the exit code (see the module docstring).

    ``plugins`` is the plugin context every command runs with (backends,
    handlers, spec validators, event upcasters), by default the process's
    entry-point manager.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        context = Context(args, out, err, plugin_manager() if plugins is None else plugins)
        code: int = args.handler(context)
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
        return _fail(
            err,
            "owned",
            f"{exc}; another process owns it until it releases or its lease expires "
            "(a worker lets a run go once only waits are left; signal with --wait SECONDS to retry)",
        )
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
