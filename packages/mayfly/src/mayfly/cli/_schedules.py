"""``mayfly schedule``: durable schedules stored in the journal (``add``, ``list``, ``show``, ``remove``)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from mayfly.cli._support import EXIT, Context, UsageError, load_spec, parse_json
from mayfly.inspect.render import wall_time
from mayfly.journal import WorkflowJournal
from mayfly.model.errors import InvalidJSONValue, InvalidRecord, LimitExceeded, MayflyError
from mayfly.model.ids import QUEUE_NAME
from mayfly.reducer import check_input
from mayfly.schedules import (
    CATCH_UP_POLICIES,
    SCHEDULE_STORE,
    Schedule,
    ScheduleStore,
    StoredSchedule,
    check_schedule_name,
    tick_run_id,
)

__all__ = ["ScheduleNotFound", "cmd_schedule", "parse_duration"]

_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")


class ScheduleNotFound(MayflyError):
    """``mayfly schedule show`` of a name the journal stores no schedule under (exit code 3)."""


def parse_duration(text: str) -> int:
    """``2s``, ``500ms``, ``5m``, ``1h``, ``1d`` or a sum such as ``1h30m``, in ms; else ValueError."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"duration {text!r} must be a number and a unit (ms, s, m, h, d), such as 2s, 5m or 1h30m"
        )
    return sum(int(number) * _UNITS[unit] for number, unit in parts)


def _store(journal: WorkflowJournal) -> ScheduleStore:
    store = SCHEDULE_STORE.of(journal)
    if store is None:
        journal.close()
        raise UsageError(
            f"journal {journal.url} does not declare schedule_store, so it cannot keep schedules; "
            "use one that does (file, lmdb, postgresql, standalone redis), or give the schedules to "
            "the workers in code (`schedules` in the handlers module)"
        )
    return store


def _schedule(ctx: Context) -> Schedule:
    """The schedule ``add`` stores, from its arguments; any problem is a usage error."""
    args = ctx.args
    if args.spec is None:
        raise UsageError("`schedule add` needs NAME and SPEC (the workflow specification file)")
    if (args.every is None) == (args.cron is None):
        raise UsageError("`schedule add` needs exactly one of --every DURATION and --cron EXPR")
    spec = load_spec(args.spec)
    run_input = parse_json(args.input, "--input")
    try:
        check_input(run_input, "schedule input")
    except (LimitExceeded, InvalidJSONValue) as exc:
        raise UsageError(f"--input: {exc}") from None
    if QUEUE_NAME.fullmatch(args.queue) is None:
        raise UsageError(f"--queue {args.queue!r}: a queue name must match {QUEUE_NAME.pattern}")
    timing: dict[str, Any] = {}
    try:
        if args.every is not None:
            timing["every_ms"] = parse_duration(args.every)
            if args.offset is not None:
                timing["offset_ms"] = parse_duration(args.offset)
        elif args.offset is not None:
            raise UsageError("--offset shifts --every ticks; a --cron expression says its own times")
        else:
            timing["cron"] = args.cron
    except ValueError as exc:
        raise UsageError(f"--every/--offset: {exc}") from None
    ctx.plugins.ensure_valid(spec)  # refused before the journal is opened
    try:
        return Schedule(
            name=args.name,
            spec=spec,
            input=run_input,
            queue=args.queue,
            catch_up=args.catch_up,
            **timing,
        )
    except InvalidRecord as exc:
        raise UsageError(str(exc)) from None


def _row(stored: StoredSchedule, now_ms: int, *, with_spec: bool = False) -> dict[str, object]:
    schedule = stored.schedule
    next_tick = schedule.next_after(now_ms)
    row: dict[str, object] = {
        "name": schedule.name,
        "when": schedule.when,
        "every_ms": schedule.every_ms,
        "offset_ms": schedule.offset_ms,
        "cron": schedule.cron,
        "workflow_id": schedule.spec.workflow_id,
        "workflow_version": schedule.spec.version,
        "queue": schedule.queue,
        "catch_up": schedule.policy,
        "input": schedule.input,
        "version": stored.version,
        "created_ms": stored.created_ms,
        "updated_ms": stored.updated_ms,
        "last_tick_ms": stored.last_tick_ms,
        "last_run_id": None
        if stored.last_tick_ms is None
        else tick_run_id(schedule.name, stored.last_tick_ms),
        "next_tick_ms": next_tick,
        "next_run_id": tick_run_id(schedule.name, next_tick),
    }
    if with_spec:
        row["spec"] = json.loads(schedule.spec.to_json())  # canonical: defaults left out
    return row


def _table(rows: list[dict[str, object]]) -> str:
    header = ("SCHEDULE", "WHEN", "WORKFLOW", "QUEUE", "CATCH-UP", "VERSION", "LAST TICK", "NEXT TICK")
    lines = [header]
    for row in rows:
        last = row["last_tick_ms"]
        lines.append(
            (
                str(row["name"]),
                str(row["when"]),
                f"{row['workflow_id']}@{row['workflow_version']}",
                str(row["queue"]),
                str(row["catch_up"]),
                str(row["version"]),
                "-" if not isinstance(last, int) else wall_time(last),
                wall_time(int(str(row["next_tick_ms"]))),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _details(row: dict[str, object]) -> str:
    last = row["last_tick_ms"]
    last_text = "-" if not isinstance(last, int) else f"{wall_time(last)} (run {row['last_run_id']})"
    lines = [
        f"schedule   {row['name']} (version {row['version']})",
        f"when       {row['when']} (UTC)",
        f"workflow   {row['workflow_id']}@{row['workflow_version']}",
        f"queue      {row['queue']}",
        f"catch-up   {row['catch_up']}",
        f"input      {json.dumps(row['input'], sort_keys=True)}",
        f"created    {wall_time(int(str(row['created_ms'])))}",
        f"updated    {wall_time(int(str(row['updated_ms'])))}",
        f"last tick  {last_text}",
        f"next tick  {wall_time(int(str(row['next_tick_ms'])))} (run {row['next_run_id']})",
    ]
    return "\n".join(lines)


def cmd_schedule(ctx: Context) -> int:
    """``mayfly schedule add|list|show|remove``: durable schedules, stored in the journal."""
    args = ctx.args
    action = args.action
    if action != "list" and args.name is None:
        raise UsageError(f"`schedule {action}` needs a schedule NAME")
    if action == "list" and args.name is not None:
        raise UsageError("`schedule list` takes no NAME; `schedule show NAME` shows one")
    if args.name is not None:
        try:
            check_schedule_name(args.name)
        except InvalidRecord as exc:
            raise UsageError(str(exc)) from None
    given = (args.spec, args.every, args.cron, args.offset, args.input, args.catch_up)
    if action != "add" and (args.replace or any(value is not None for value in given)):
        raise UsageError(
            f"`schedule {action}` takes only a NAME; `schedule add NAME SPEC --every 1m` adds one"
        )
    schedule = _schedule(ctx) if action == "add" else None
    # Adding may create the journal (like submit); reading or removing never does.
    journal = ctx.plugins.open_journal(ctx.journal_url) if action == "add" else ctx.open_journal()
    try:
        store = _store(journal)
        now = time.time_ns() // 1_000_000
        if schedule is not None:
            stored = store.schedule_put(schedule, now_ms=now, expected_version=None if args.replace else 0)
            row = _row(stored, now)
            if ctx.json:
                ctx.emit_json(row)
            else:
                verb = "added" if stored.version == 1 else f"replaced (version {stored.version})"
                ctx.out.write(
                    f"schedule {stored.name} {verb}: {row['when']}, workflow {row['workflow_id']}"
                    f"@{row['workflow_version']} on queue {row['queue']}, catch-up {row['catch_up']}; "
                    f"next tick {wall_time(int(str(row['next_tick_ms'])))}\n"
                )
                ctx.hint(
                    f"every worker of this journal starts its runs within its poll interval "
                    f"(`{ctx.mayfly} worker --handlers MODULE`); `{ctx.mayfly} schedule list` lists them"
                )
            return EXIT["ok"]
        if action == "remove":
            removed = store.schedule_remove(args.name)
            if ctx.json:
                ctx.emit_json({"name": args.name, "removed": removed})
            elif removed:
                ctx.out.write(
                    f"schedule {args.name} removed: workers stop starting its runs within their poll "
                    "interval (runs already started go on)\n"
                )
            else:
                ctx.out.write(f"no schedule {args.name} in this journal: nothing removed\n")
            return EXIT["ok"]
        if action == "show":
            found = store.schedule_get(args.name)
            if found is None:
                raise ScheduleNotFound(
                    f"no schedule {args.name} in journal {journal.url}; "
                    f"`{ctx.mayfly} schedule list` lists them"
                )
            row = _row(found, now, with_spec=True)
            if ctx.json:
                ctx.emit_json(row)
            else:
                ctx.out.write(_details(row) + "\n")
            return EXIT["ok"]
        rows = [_row(stored, now) for stored in store.schedule_list()]
    finally:
        journal.close()
    if ctx.json:
        ctx.emit_json(rows)
    elif not rows:
        ctx.out.write("no schedules are stored in this journal\n")
        ctx.hint(f"`{ctx.mayfly} schedule add NAME SPEC --every 5m` adds one")
    else:
        ctx.out.write(_table(rows) + "\n")
    return EXIT["ok"]


def catch_up_choices() -> tuple[str, ...]:
    """The ``--catch-up`` choices."""
    return CATCH_UP_POLICIES
