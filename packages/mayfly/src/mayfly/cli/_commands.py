"""The ``mayfly`` commands, one function each, all run with one :class:`~mayfly.cli._support.Context`."""

from __future__ import annotations

import os
import time

import msgspec

from mayfly import demo as demo_module
from mayfly.cli._support import (
    EXIT,
    Context,
    Timeline,
    UsageError,
    describe_effect,
    driving,
    handler_registry,
    load_spec,
    paint,
    parse_decision,
    parse_json,
    print_result,
    resolve_run,
    result_code,
    signal_id_argument,
    status_of,
    timeline_line,
    timer_wait,
    when_text,
)
from mayfly.identity import Uuid7IdSource
from mayfly.inspect import (
    WAITING,
    build_inspection,
    journal_children,
    list_runs,
    load_inspection,
    render_mermaid,
    render_table,
    run_status,
    to_json,
    wake_at_ms,
)
from mayfly.journal import RUN_VERIFICATION
from mayfly.model.errors import InvalidJSONValue, LeaseHeld, LimitExceeded, ResumeRefused
from mayfly.model.signals import SignalToken
from mayfly.model.state import RunState, RunStatus
from mayfly.recovery import RecoveryEffect, inspect_run, replay_run
from mayfly.reducer import check_input, decode_event
from mayfly.runtime import HandlerRegistry, cancel_run_cascade

__all__ = [
    "cmd_backends",
    "cmd_cancel",
    "cmd_demo",
    "cmd_inspect",
    "cmd_replay",
    "cmd_resume",
    "cmd_run",
    "cmd_runs",
    "cmd_signal",
    "cmd_watch",
]


def _observer(ctx: Context, spec_nodes: int) -> Timeline | None:
    if ctx.args.json:
        return None
    verbose = getattr(ctx.args, "timeline", False)
    progress = ctx.err.isatty() and spec_nodes >= 20
    return Timeline(ctx.err if not verbose else ctx.out, verbose=verbose, progress=progress)


def cmd_run(ctx: Context) -> int:
    """``mayfly run SPEC --handlers MODULE``."""
    args = ctx.args
    spec = load_spec(args.spec)
    registry = handler_registry(ctx, args.handlers)
    run_input = parse_json(args.input, "--input")
    try:
        check_input(run_input, "run input")
    except (LimitExceeded, InvalidJSONValue) as exc:
        raise UsageError(f"--input: {exc}") from None
    # Refused before the journal is opened, so a rejected run leaves no store behind; the plugins'
    # validators run here as they do in WorkflowRuntime.execute.
    ctx.plugins.ensure_valid(spec)
    registry.check(spec)
    runtime = ctx.runtime(registry, _observer(ctx, len(spec.nodes)))
    run_id = runtime.ids.new_id()
    result = driving(ctx, run_id, args.handlers, lambda: runtime.execute(spec, run_input, run_id=run_id))
    print_result(ctx, runtime, result)
    return result_code(result)


def cmd_resume(ctx: Context) -> int:
    """``mayfly resume RUN``."""
    args = ctx.args
    registry = handler_registry(ctx, args.handlers)
    ctx.require_journal()
    _install_demo_notifier(ctx, args.handlers)
    runtime = ctx.runtime(
        registry, Timeline(ctx.out, verbose=True, progress=False) if not args.json else None
    )
    run_id = resolve_run(runtime.journal, args.run)
    state = runtime.inspect(run_id).state
    wake = timer_wait(state, status_of(runtime, state))
    if wake is not None:
        # Taking the run over would only sleep until then, holding it: leave it parked, as a worker does.
        print_result(ctx, runtime, runtime.summary_of(state))
        if not args.json:
            ctx.hint(
                f"run {run_id} only waits for a timer, due {when_text(wake)}; a worker on this journal "
                f"takes it then ({ctx.mayfly} worker --handlers MODULE), or run this resume after that time"
            )
        return EXIT["waiting"]

    def plan(state: RunState, effects: tuple[RecoveryEffect, ...]) -> None:
        # Printed only once this process holds the run: an owned run gets no misleading plan.
        for effect in effects:
            ctx.out.write(f"  recovery: {describe_effect(effect)}\n")
        ctx.out.flush()

    try:
        result = driving(
            ctx,
            run_id,
            args.handlers,
            lambda: runtime.resume(run_id, on_recovery=None if args.json else plan),
        )
    except ResumeRefused as exc:
        # Exit 2: the run is intact and unowned; the same command with the right handlers continues it.
        given = (
            "no --handlers module was given"
            if args.handlers is None
            else f"the handlers module {args.handlers!r} does not serve them"
        )
        raise UsageError(
            f"{exc}; {given}: continue with `{ctx.resume_command(run_id, 'MODULE')}`, where MODULE "
            "registers them (installed plugins are always loaded)"
        ) from None
    print_result(ctx, runtime, result)
    return result_code(result)


def cmd_runs(ctx: Context) -> int:
    """``mayfly runs [--state S] [--workflow W] [--limit N]``."""
    args = ctx.args
    listings = list_runs(
        ctx.open_journal(), state=args.state, workflow=args.workflow, limit=args.limit, plugins=ctx.plugins
    )
    if args.json:
        rows: list[dict[str, object]] = []
        for listing in listings:
            row: dict[str, object] = {
                "run_id": listing.run_id,
                "workflow": listing.workflow,
                "status": listing.status,
                "nodes_done": listing.nodes_done,
                "nodes": listing.nodes,
                "waiting_on": ",".join(listing.waiting_on),
            }
            if listing.error:
                row["error"] = listing.error
            rows.append(row)
        ctx.emit_json(rows)
        return EXIT["ok"]
    out = ctx.out
    if not listings:
        out.write("no runs\n")
        return EXIT["ok"]
    out.write(f"{'RUN':<36}  {'WORKFLOW':<30}  {'STATUS':<10}  NODES\n")
    for r in listings:
        extra = f"  waiting on {','.join(r.waiting_on)}" if r.waiting_on else ""
        if r.error:
            extra = f"  {r.error}"
        done = f"{r.nodes_done}/{r.nodes}"
        status = paint(ctx, f"{r.status:<10}", r.status)
        out.write(f"{r.run_id:<36}  {r.workflow:<30}  {status}  {done}{extra}\n")
    return EXIT["ok"]


def cmd_inspect(ctx: Context) -> int:
    """``mayfly inspect RUN [--json | --mermaid]``."""
    args = ctx.args
    if args.mermaid and args.json:
        raise UsageError("--json and --mermaid are exclusive: pick JSON or a Mermaid diagram")
    journal = ctx.open_journal()
    run_id = resolve_run(journal, args.run)
    upcasters = ctx.plugins.event_upcasters()
    recovered = inspect_run(journal, run_id, upcasters=upcasters)
    # Every record is scanned (attempt numbers and times come from them); --history caps only the lines.
    inspection = build_inspection(
        recovered,
        journal.read(run_id),
        args.history,
        journal_url=journal.url,
        upcasters=upcasters,
        children=journal_children(journal, upcasters),
    )
    if args.mermaid:
        ctx.out.write(render_mermaid(inspection, recovered.state.spec) + "\n")
    elif args.json:
        ctx.out.write(to_json(inspection).decode() + "\n")
    else:
        ctx.out.write(render_table(inspection, wall_ms=int(time.time() * 1000)) + "\n")
    return EXIT["ok"]


def cmd_replay(ctx: Context) -> int:
    """``mayfly replay RUN``: reduce the full history, ignoring snapshots, and compare."""
    args = ctx.args
    journal = ctx.open_journal()
    upcasters = ctx.plugins.event_upcasters()
    run_id = resolve_run(journal, args.run)
    started = time.monotonic()
    verifier = RUN_VERIFICATION.of(journal)
    if verifier is not None:
        verifier.verify_run(run_id)  # a backend that can check every stored frame does so before the replay
    full = replay_run(journal, run_id, upcasters=upcasters)
    elapsed = time.monotonic() - started
    cached = inspect_run(journal, run_id, upcasters=upcasters)
    same = msgspec.json.encode(full.state.to_record()) == msgspec.json.encode(cached.state.to_record())
    word = run_status(full.state, journal_children(journal, upcasters))
    report = {
        "run_id": run_id,
        "status": word,
        "events": full.records_reduced,
        "seconds": round(elapsed, 6),
        "snapshot_agrees": same,
        "snapshot_source": cached.source,
        "diagnostics": list(cached.diagnostics),
    }
    if args.json:
        ctx.emit_json(report)
    else:
        ctx.out.write(
            f"run {run_id}: replayed {full.records_reduced} events in {elapsed * 1000:.1f} ms; "
            f"status {word}; snapshot {'agrees' if same else 'DISAGREES'} "
            f"(inspection used {cached.source})\n"
        )
        for diagnostic in cached.diagnostics:
            ctx.out.write(f"  {diagnostic}\n")
    return EXIT["ok"] if same else EXIT["journal"]


def cmd_signal(ctx: Context) -> int:
    """``mayfly signal RUN NODE --token T --decision JSON``."""
    args = ctx.args
    ctx.require_journal()
    runtime = ctx.runtime(HandlerRegistry())
    run_id = resolve_run(runtime.journal, args.run)
    decision = parse_decision(args.decision)
    if isinstance(decision, str):
        decision = {"decision": decision, "by": args.by}
    elif isinstance(decision, dict):
        decision.setdefault("by", args.by)
    try:
        token = SignalToken(args.token)
    except ValueError as exc:
        raise UsageError(f"--token: {exc}") from None
    signal_id = signal_id_argument(args.signal_id) if args.signal_id is not None else runtime.ids.new_id()
    deadline = time.monotonic() + args.wait
    pause = 0.05
    while True:
        try:
            disposition = runtime.signal(
                run_id, args.node, token, decision, signal_id=signal_id, name=args.name
            )
            break
        except LeaseHeld:
            # A worker drives the run (other nodes are still running): it parks the run, and
            # releases it, once only waits are left. The same signal id keeps retries idempotent.
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
    chosen = "" if args.signal_id is None or args.signal_id == disposition.signal_id else args.signal_id
    if args.json:
        ctx.emit_json(
            {
                "signal_id": disposition.signal_id,
                "status": disposition.status,
                "reason": disposition.reason,
                **({"chosen_id": chosen} if chosen else {}),
            }
        )
    else:
        named = f"{chosen} ({disposition.signal_id})" if chosen else disposition.signal_id
        ctx.out.write(f"signal {named} to {args.node}: {disposition.status}")
        ctx.out.write(f" ({disposition.reason})\n" if disposition.reason else "\n")
    if disposition.status == "accepted":
        ctx.hint(
            f"next: a worker on this journal continues the run ({ctx.mayfly} worker --handlers MODULE), "
            f"or here: {ctx.mayfly} resume {run_id} --handlers MODULE"
        )
    return EXIT["ok"] if disposition.status != "rejected" else EXIT["usage"]


def cmd_cancel(ctx: Context) -> int:
    """``mayfly cancel RUN --reason R``: cancel a run and its open child runs."""
    args = ctx.args
    ctx.require_journal()
    runtime = ctx.runtime()
    run_id = resolve_run(runtime.journal, args.run)
    before = runtime.inspect(run_id).state
    if before.status.is_terminal:
        raise UsageError(
            f"run_terminal: run {run_id} already {before.status.value}; it accepts no more commands"
        )
    cancel_run_cascade(
        runtime.journal,
        runtime.leases,
        run_id,
        requester=args.requester,
        reason=args.reason,
        owner=f"mayfly-cli:{os.getpid()}",
        ids=Uuid7IdSource(),
        upcasters=runtime.upcasters,
    )
    word = status_of(runtime, runtime.inspect(run_id).state)
    if args.json:
        ctx.emit_json({"run_id": run_id, "status": word})
    else:
        ctx.out.write(f"run {run_id}: {word}\n")
    return EXIT["ok"]


def cmd_backends(ctx: Context) -> int:
    """``mayfly backends``."""
    url = ctx.args.journal or os.environ.get("MAYFLY_JOURNAL")
    infos = ctx.plugins.list_backends(url)
    if ctx.args.json:
        ctx.emit_json(
            [
                {
                    "kind": b.kind,
                    "scheme": b.scheme,
                    "distribution": b.distribution,
                    "plugin": b.plugin,
                    "description": b.description,
                }
                for b in infos
            ]
        )
        return EXIT["ok"]
    for b in infos:
        ctx.out.write(f"{b.kind:<8} {b.scheme + '://':<14} {b.distribution:<18} {b.description}\n")
    return EXIT["ok"]


def _signal_command(ctx: Context, run_id: str, node_id: str, token: str) -> str:
    return f"{ctx.mayfly} signal {run_id} {node_id} --token {token} --decision approve"


def _install_demo_notifier(ctx: Context, handlers: str | None, tokens: dict[str, str] | None = None) -> None:
    """Tell the demo's approval step how to announce itself: the commands that approve and continue it.

    With ``tokens``, the tokens are also collected (for ``--auto-approve`` and ``--json``); the
    commands are printed (on standard error, unless ``--quiet``) only while nobody approves for us.
    """
    auto = bool(getattr(ctx.args, "auto_approve", False))

    def notify(run_id: str, node_id: str, token: str) -> None:
        if tokens is not None:
            tokens[run_id] = token
        if auto:
            return
        ctx.hint(
            f"\napproval requested for run {run_id}. Approve it with:\n"
            f"  {_signal_command(ctx, run_id, node_id, token)}\n"
            f"then continue it with:\n  {ctx.resume_command(run_id, handlers)}\n"
        )

    demo_module.set_approval_notifier(notify)


def cmd_demo(ctx: Context) -> int:
    """``mayfly demo [--auto-approve] [--crash-at NODE]``: the code-review pipeline, end to end."""
    args = ctx.args
    out, err = ctx.out, ctx.err
    # The demo's handlers come from its module, exactly as `--handlers mayfly.demo` loads them for a
    # resume in another process: the demo is not a plugin, so no other registry ever holds them.
    handlers = demo_module.HANDLERS_MODULE
    registry = handler_registry(ctx, handlers)
    tokens: dict[str, str] = {}
    _install_demo_notifier(ctx, handlers, tokens)
    if args.crash_at:
        nodes = [n.id for n in demo_module.DEMO_SPEC.nodes if n.id != "approval"]
        if args.crash_at not in nodes:
            raise UsageError(
                f"--crash-at {args.crash_at!r} is not a demo node; choose one of {', '.join(nodes)} "
                "(approval only waits, so it cannot crash)"
            )
        demo_module.crash_at(args.crash_at)
    timeline = None if args.json else Timeline(out, verbose=True, progress=False)
    runtime = ctx.runtime(registry, timeline)
    run_id = runtime.ids.new_id()
    resume = ctx.resume_command(run_id, handlers)
    if not args.json:
        out.write(f"mayfly demo: code-review pipeline, run {run_id}\njournal: {ctx.journal_url}\n")
        if args.crash_at:
            out.write(
                f"this process will be killed (SIGKILL) when {args.crash_at!r} starts; "
                f"continue afterwards with:\n  {resume}\n"
            )
        out.write("\n")
        out.flush()
    elif args.crash_at:
        # Standard output stays pure JSON, and this process dies before printing any: say the run id here.
        err.write(f"mayfly demo: run {run_id} will be killed at {args.crash_at!r}; then: {resume}\n")
        err.flush()
    result = driving(
        ctx,
        run_id,
        handlers,
        lambda: runtime.execute(demo_module.DEMO_SPEC, {"requested_by": "demo"}, run_id=run_id),
    )
    if args.auto_approve and result.waiting:
        token = tokens[run_id]
        if not args.json:
            out.write(
                f"  {time.monotonic() - timeline.start if timeline else 0:6.2f}s  "
                "run parked durably; approving it (--auto-approve) and resuming\n"
            )
        runtime.signal(run_id, "approval", token, {"decision": "approve", "by": "mayfly demo --auto-approve"})
        result = driving(ctx, run_id, handlers, lambda: runtime.resume(run_id))
    if args.json:
        document = msgspec.to_builtins(result)
        document["status"] = status_of(runtime, runtime.inspect(run_id).state)
        if result.waiting and run_id in tokens:
            # The demo asks for approval: a script needs the token to give it (the text mode prints it).
            document["approval"] = {
                "node": "approval",
                "token": tokens[run_id],
                "signal": _signal_command(ctx, run_id, "approval", tokens[run_id]),
                "resume": resume,
            }
        ctx.emit_json(document)
    else:
        inspection = load_inspection(runtime.journal, run_id, plugins=ctx.plugins)
        out.write("\n" + render_table(inspection, wall_ms=int(time.time() * 1000)) + "\n")
        if result.waiting:
            ctx.hint("\nthe run is parked waiting for approval; see the `mayfly signal` command above.")
    return result_code(result)


def cmd_watch(ctx: Context) -> int:
    """``mayfly watch RUN [--timeout S]``: print each committed fact until the run ends or parks.

    Exits with ``mayfly result``'s codes (0, 1, 6), or 124 when ``--timeout`` passes first. The run
    is only read: Ctrl-C stops the watching, never the run.
    """
    args = ctx.args
    if args.interval <= 0 or args.interval > 60:
        raise UsageError(f"--interval must be more than 0 and at most 60 seconds, got {args.interval}")
    ctx.require_journal()
    runtime = ctx.runtime()
    journal = runtime.journal
    run_id = resolve_run(journal, args.run)
    children = journal_children(journal, runtime.upcasters)

    def parked() -> bool:
        """Whether the run ended, or parked: it only waits, and not just for a timer due within a second."""
        state = runtime.inspect(run_id).state
        word = run_status(state, children)
        if word != WAITING:
            return word != RunStatus.RUNNING.value
        # Waiting only for a timer due this soon: whoever drives the run sleeps through it, and goes on.
        only_a_timer = not state.waiting_count and wake_at_ms(state) is not None
        return not only_a_timer or timer_wait(state, word) is not None

    parked()  # RunNotFound (exit 3) before anything is printed
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    if not args.json:
        ctx.hint(f"watching run {run_id} on {ctx.journal_url} (Ctrl-C stops watching, not the run)")
    after = 0

    def show() -> None:
        nonlocal after
        for record in journal.read(run_id, after=after):
            after = record.sequence
            event = decode_event(
                record.event_type, record.schema_version, record.payload, upcasters=runtime.upcasters
            )
            line = timeline_line(event)
            if line is None:
                continue
            if args.json:
                ctx.emit_json({"sequence": record.sequence, "event": record.event_type, "line": line})
            else:
                ctx.out.write(f"  #{record.sequence:<5} {line}\n")
        ctx.out.flush()

    while True:
        show()
        if getattr(ctx.out, "closed_pipe", False):
            return EXIT["ok"]  # nobody reads any more (`mayfly watch RUN | head`)
        if parked():
            show()  # the facts committed between the last read and the status
            break
        if deadline is not None and time.monotonic() >= deadline:
            ctx.err.write(f"mayfly: run {run_id} neither ended nor parked within {args.timeout} s\n")
            return EXIT["timeout"]
        left = args.interval if deadline is None else deadline - time.monotonic()
        time.sleep(max(0.0, min(args.interval, left)))
    result = runtime.summary(run_id)
    print_result(ctx, runtime, result)
    return result_code(result)
