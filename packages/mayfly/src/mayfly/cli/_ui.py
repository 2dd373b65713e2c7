"""``mayfly ui``: serve the read-only web console of a journal until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import ipaddress
import os
import stat

import msgspec

from mayfly.cli._support import EXIT, Context, UsageError
from mayfly.console import Console, serve

__all__ = ["add_ui_arguments", "cmd_ui"]

UI_HELP = """\
The console binds 127.0.0.1 by default: anyone who can reach the port can read run
states, node ids, reasons and queue settings (never inputs, outputs, decisions or
tokens). It answers only requests addressed to an IP address or localhost, unless
--allow-host names another host (a proxy in front of it). Write actions (signal,
cancel) are off unless --allow-writes is given with --token-file; each then needs
that token and a confirmation.

exit codes: 0 stopped by SIGTERM or Ctrl-C; 2 usage (a bad flag, an unusable token
file, the address in use); 5 no journal at --journal, or it cannot be read."""


def add_ui_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``mayfly ui``."""
    parser.epilog = UI_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8080, help="port to bind (default 8080; 0 picks a free one)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (a proxy's); repeat for several",
    )
    parser.add_argument(
        "--access-log", action="store_true", help="print one line per request on standard error"
    )
    parser.add_argument(
        "--allow-writes",
        action="store_true",
        help="serve the signal and cancel actions (needs --token-file)",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the token write actions need (at least 16 characters; not readable by others)",
    )


def _token(path: str) -> str:
    try:
        info = os.stat(path)
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--token-file {path}: cannot read it ({exc})") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"--token-file {path}: others can read it; run `chmod 600 {path}`")
    if len(token) < 16:
        raise UsageError(f"--token-file {path}: the token must be at least 16 characters")
    return token


def cmd_ui(ctx: Context) -> int:
    """``mayfly ui [--host H] [--port P] [--allow-writes --token-file PATH]``."""
    args = ctx.args
    if not 0 <= args.port <= 65_535:
        raise UsageError(f"--port {args.port}: expected 0 to 65535")
    try:
        ipaddress.ip_address(args.host)
    except ValueError:
        raise UsageError(f"--host {args.host!r}: expected an IP address such as 127.0.0.1") from None
    if args.allow_writes != (args.token_file is not None):
        raise UsageError("--allow-writes and --token-file go together: write actions need a token")
    token = _token(args.token_file) if args.token_file is not None else None
    ctx.require_journal()
    console = Console(ctx.journal_url, plugins=ctx.plugins, write_token=token, allowed_hosts=args.allow_host)

    def ready(url: str) -> None:
        if ctx.json:
            ctx.emit_json({"url": url, "writes": token is not None})
        else:
            ctx.out.write(f"mayfly ui: serving {url}/runs (Ctrl-C stops it)\n")
        ctx.out.flush()

    def access(line: str) -> None:
        ctx.err.write(f"mayfly ui: {line}\n")
        ctx.err.flush()

    try:
        serve(console, args.host, args.port, on_ready=ready, log=access if args.access_log else None)
    except OSError as exc:
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    finally:
        console.close()
    if not ctx.json:
        ctx.out.write("mayfly ui: stopped\n")
    else:
        ctx.out.write(msgspec.json.encode({"stopped": True}).decode() + "\n")
    return EXIT["ok"]
