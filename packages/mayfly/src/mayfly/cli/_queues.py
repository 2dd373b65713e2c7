"""``mayfly queue``: a queue's durable flow control (``set``, ``list``, ``show``, ``remove``)."""

from __future__ import annotations

import time

import msgspec

from mayfly.cli._support import EXIT, Context, UsageError
from mayfly.journal import WorkflowJournal
from mayfly.model.ids import QUEUE_NAME
from mayfly.queues import QUEUE_CONTROL, QueueControl, QueueSettings, QueueUsage, parse_rate

__all__ = ["cmd_queue"]

_UNLIMITED = "unlimited"


def _control(ctx: Context, journal: WorkflowJournal) -> QueueControl:
    control = QUEUE_CONTROL.of(journal)
    if control is None:
        journal.close()
        raise UsageError(
            f"journal {journal.url} does not declare queue_control, so it cannot keep queue limits; "
            "use one that does: file, lmdb, postgresql or standalone redis"
        )
    return control


def _limit(flag: str, text: str) -> int | None:
    if text == _UNLIMITED:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{flag} {text!r}: expected a whole number >= 1, or {_UNLIMITED}")
    return int(text)


def _settings(ctx: Context, current: QueueSettings | None) -> QueueSettings:
    """The queue's new settings: its current ones (unless ``--reset``) with the flags given applied."""
    args = ctx.args
    name = args.name
    base = QueueSettings(name=name) if current is None or args.reset else current
    changes: dict[str, object] = {}
    if args.concurrency is not None:
        changes["concurrency"] = _limit("--concurrency", args.concurrency)
    if args.worker_concurrency is not None:
        changes["worker_concurrency"] = _limit("--worker-concurrency", args.worker_concurrency)
    if args.rate is not None:
        if args.rate == _UNLIMITED:
            changes["rate_limit"] = changes["rate_period_ms"] = None
        else:
            try:
                changes["rate_limit"], changes["rate_period_ms"] = parse_rate(args.rate)
            except ValueError as exc:
                raise UsageError(f"--rate: {exc}") from None
    if args.priority is not None:
        changes["priority"] = args.priority
    return msgspec.structs.replace(base, **changes)  # validated in __post_init__


def _row(settings: QueueSettings, usage: QueueUsage) -> dict[str, object]:
    return {
        "name": settings.name,
        "rate": settings.rate,
        "concurrency": settings.concurrency,
        "worker_concurrency": settings.worker_concurrency,
        "rate_limit": settings.rate_limit,
        "rate_period_ms": settings.rate_period_ms,
        "priority": settings.priority,
        "in_progress": usage.in_progress,
        "recent_starts": usage.recent_starts,
    }


def _table(rows: list[dict[str, object]]) -> str:
    header = ("QUEUE", "CONCURRENCY", "PER WORKER", "RATE", "ORDER", "IN PROGRESS", "STARTS IN WINDOW")
    lines = [header]
    for row in rows:
        lines.append(
            (
                str(row["name"]),
                "-" if row["concurrency"] is None else str(row["concurrency"]),
                "-" if row["worker_concurrency"] is None else str(row["worker_concurrency"]),
                "-" if row["rate"] is None else str(row["rate"]),
                "priority" if row["priority"] else "fifo",
                str(row["in_progress"]),
                "-" if row["rate_limit"] is None else str(row["recent_starts"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def cmd_queue(ctx: Context) -> int:
    """``mayfly queue set|show|list|remove``: a queue's flow control, stored in the journal."""
    args = ctx.args
    action = args.action
    if action != "list" and args.name is None:
        raise UsageError(f"`queue {action}` needs a queue NAME")
    if args.name is not None and QUEUE_NAME.fullmatch(args.name) is None:
        raise UsageError(f"queue name {args.name!r}: a queue name must match {QUEUE_NAME.pattern}")
    given = (args.concurrency, args.worker_concurrency, args.rate, args.priority)
    if action != "set" and (args.reset or any(value is not None for value in given)):
        raise UsageError(f"`queue {action}` takes no settings; `queue set NAME --concurrency N` changes them")
    # Setting a queue's limits may create the journal (like submit); reading one never does.
    journal = ctx.plugins.open_journal(ctx.journal_url) if action == "set" else ctx.open_journal()
    try:
        control = _control(ctx, journal)
        now = time.time_ns() // 1_000_000
        if action == "set":
            settings = _settings(ctx, control.queue_get(args.name))
            control.queue_set(settings)
            shown = [_row(settings, control.queue_usage(settings.name, now_ms=now))]
        elif action == "remove":
            removed = control.queue_remove(args.name)
            if ctx.json:
                ctx.emit_json({"name": args.name, "removed": removed})
            else:
                ctx.out.write(
                    f"queue {args.name}: limits removed\n"
                    if removed
                    else f"queue {args.name} had no limits\n"
                )
            return EXIT["ok"]
        elif action == "show":
            found = control.queue_get(args.name)
            if found is None:
                if ctx.json:
                    ctx.emit_json({"name": args.name, "settings": None})
                else:
                    ctx.out.write(
                        f"queue {args.name} has no limits: its runs are claimed first come, first served\n"
                    )
                return EXIT["ok"]
            shown = [_row(found, control.queue_usage(found.name, now_ms=now))]
        else:
            shown = [_row(s, control.queue_usage(s.name, now_ms=now)) for s in control.queue_list()]
    finally:
        journal.close()
    if ctx.json:
        ctx.emit_json(shown[0] if action in ("set", "show") else shown)
    elif not shown:
        ctx.out.write(
            "no queue has limits (queues without settings are unlimited and first come, first served)\n"
        )
        ctx.hint(f"`{ctx.mayfly} queue set NAME --concurrency N` limits one")
    else:
        ctx.out.write(_table(shown) + "\n")
    return EXIT["ok"]
