"""``mayfly submit``, ``worker``, ``result`` and ``index rebuild``: runs that workers drive."""

from __future__ import annotations

import time

from mayfly.cli._support import (
    EXIT,
    Context,
    UsageError,
    handler_registry,
    handlers_schedules,
    invoked_command,
    load_spec,
    parse_json,
    print_result,
    resolve_run,
    result_code,
)
from mayfly.model.errors import InvalidJSONValue, LimitExceeded, WaitTimeout
from mayfly.model.ids import QUEUE_NAME, is_uuid
from mayfly.recovery import rebuild_run_index
from mayfly.reducer import check_input
from mayfly.worker import Worker, json_log

__all__ = ["cmd_index", "cmd_result", "cmd_submit", "cmd_worker"]


def _queue(name: str) -> str:
    if QUEUE_NAME.fullmatch(name) is None:
        raise UsageError(f"--queue {name!r}: a queue name must match {QUEUE_NAME.pattern}")
    return name


def cmd_submit(ctx: Context) -> int:
    """``mayfly submit SPEC [--input JSON] [--queue Q] [--run-id ID]``: create a run for a worker to drive."""
    args = ctx.args
    spec = load_spec(args.spec)
    run_input = parse_json(args.input, "--input")
    try:
        check_input(run_input, "run input")
    except (LimitExceeded, InvalidJSONValue) as exc:
        raise UsageError(f"--input: {exc}") from None
    queue = _queue(args.queue)
    if args.run_id is not None and not is_uuid(args.run_id):
        raise UsageError(f"--run-id {args.run_id!r}: expected a canonical lowercase UUID")
    ctx.plugins.ensure_valid(spec)  # refused before the journal is opened
    runtime = ctx.runtime()
    handle = runtime.start(
        spec, run_input, run_id=args.run_id, queue=queue, priority=args.priority, dedup_id=args.dedup_id
    )
    if args.json:
        ctx.emit_json({"run_id": handle.run_id})
    else:
        ctx.out.write(f"{handle.run_id}\n")
        ctx.hint(
            f"submitted to queue {queue}; a worker drives it ({ctx.mayfly} worker --handlers MODULE), "
            f"and `{ctx.mayfly} result {handle.run_id} --wait` waits for its result"
        )
    return EXIT["ok"]


def cmd_worker(ctx: Context) -> int:
    """``mayfly worker --handlers MODULE [--concurrency N] [--queue Q ...]``: serve until SIGTERM/SIGINT."""
    args = ctx.args
    registry = handler_registry(ctx, args.handlers)
    schedules = handlers_schedules(args.handlers)
    queues = None if not args.queue else [_queue(name) for name in args.queue]
    worker = Worker(
        ctx.journal_url,
        registry,
        concurrency=args.concurrency,
        queues=queues,
        poll_interval_ms=args.poll_interval,
        grace_ms=int(args.grace * 1000),
        plugins=ctx.plugins,
        log=json_log(ctx.err) if args.json else None,
        schedules=schedules,
        command=invoked_command(),
    )
    code = worker.serve()
    return EXIT["ok"] if code == 0 else EXIT["interrupted"]


def cmd_result(ctx: Context) -> int:
    """``mayfly result RUN [--wait] [--timeout S]``: a run's result, with the exit codes of ``run``."""
    args = ctx.args
    ctx.require_journal()
    runtime = ctx.runtime()
    run_id = resolve_run(runtime.journal, args.run)
    handle = runtime.handle(run_id)
    if args.wait:
        try:
            result = handle.result(timeout=args.timeout)
        except WaitTimeout as exc:
            ctx.err.write(f"mayfly: {exc}\n")
            return EXIT["timeout"]
    else:
        result = runtime.summary(run_id)
    print_result(ctx, runtime, result)
    return result_code(result)


def cmd_index(ctx: Context) -> int:
    """``mayfly index rebuild``: recompute the run index from the journals (progress on stderr)."""
    journal = ctx.open_journal()
    started = time.monotonic()
    shown = [started]

    def progress(count: int) -> None:
        now = time.monotonic()
        if now - shown[0] >= 1.0 and not ctx.args.json:
            ctx.err.write(f"indexed {count} runs...\n")
            shown[0] = now

    try:
        count = rebuild_run_index(journal, progress=progress, upcasters=ctx.plugins.event_upcasters())
    finally:
        journal.close()
    seconds = time.monotonic() - started
    if ctx.args.json:
        ctx.emit_json({"runs_indexed": count, "seconds": round(seconds, 3)})
    else:
        ctx.out.write(f"run index rebuilt: {count} runs in {seconds:.1f} s\n")
    return EXIT["ok"]
