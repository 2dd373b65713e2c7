"""The campaign: ``python -m mayfly_contract.sim --backend B --seeds N [--seed S] [--workers K]``.

Each seed picks a family (:mod:`mayfly_contract.sim._families`), runs it on a
fresh namespace of the backend, and reports its violations. A failing seed
prints its violations and the one command that reproduces it. The last two
lines are the throughput (seeds per second, per family counts) and the
closing line ``N seeds, V violations``. Exit status: 0 when no seed found a
violation, 1 otherwise, 2 for a usage error, 3 when a seed is stuck (still
running after ``--seed-timeout`` seconds: it prints the seed, its reproduce
command and every thread's stack).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from mayfly_contract.sim._context import BACKENDS, SeedContext, SeedResult, open_backend
from mayfly_contract.sim._families import families_for, pick_family

__all__ = ["SEED_TIMEOUT_S", "Campaign", "main", "reproduce_command", "run_campaign", "run_seed"]

SEED_TIMEOUT_S = 600
"""A seed still running after this long is stuck: the campaign prints it, its stacks, and exits 3."""


def reproduce_command(backend: str, seed: int, workers: int = 1, family: str | None = None) -> str:
    """The one command that replays ``seed`` exactly."""
    command = f"python -m mayfly_contract.sim --backend {backend} --seed {seed}"
    if workers != 1:
        command += f" --workers {workers}"
    if family is not None:
        command += f" --family {family}"
    return command


class Campaign:
    """The outcome of a campaign: every seed's result, and how long it took."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.results: dict[int, SeedResult] = {}
        self.seconds = 0.0

    @property
    def violations(self) -> int:
        """How many violations all seeds found together."""
        return sum(len(result.violations) for result in self.results.values())

    @property
    def failing(self) -> list[int]:
        """The seeds that found a violation, in order."""
        return [seed for seed, result in self.results.items() if result.violations]

    @property
    def seeds_per_second(self) -> float:
        """Throughput: seeds run per wall-clock second."""
        return len(self.results) / self.seconds if self.seconds > 0 else 0.0

    def closing_line(self) -> str:
        """``N seeds, V violations``."""
        return f"{len(self.results)} seeds, {self.violations} violations"


def run_seed(ctx: SeedContext, family: str | None = None) -> SeedResult:
    """Run one seed: its (seeded or named) family on ``ctx``'s backend."""
    chosen = pick_family(ctx.seed, ctx.backend.name, ctx.workers, only=family)
    try:
        return chosen.run(ctx)
    finally:
        ctx.backend.release(ctx.seed)


def run_campaign(
    backend: str,
    seeds: Sequence[int],
    *,
    workers: int = 1,
    family: str | None = None,
    url: str | None = None,
    directory: Path | None = None,
    out: TextIO | None = None,
    seed_timeout_s: int = SEED_TIMEOUT_S,
) -> Campaign:
    """Run ``seeds`` on ``backend``; print each failing seed with its reproduce command (to ``out``)."""
    stream = out if out is not None else sys.stdout
    campaign = Campaign(backend)
    store = open_backend(backend, url=url, directory=directory)
    started = time.perf_counter()
    try:
        for seed in seeds:
            _watch(seed, stream, reproduce_command(backend, seed, workers, family), seed_timeout_s)
            result = run_seed(SeedContext(seed, store, workers=workers), family)
            _watch(seed, stream, "", 0)
            campaign.results[seed] = result
            if result.violations:
                stream.write(f"seed {seed} ({result.family}) found {len(result.violations)} violation(s):\n")
                for violation in result.violations:
                    stream.write(
                        f"  {violation.kind} in run {violation.run_id or '-'}: {violation.message}\n"
                    )
                for note in result.notes:
                    stream.write(f"  ({note})\n")
                stream.write(f"  reproduce: {reproduce_command(backend, seed, workers, family)}\n")
                stream.flush()
    finally:
        campaign.seconds = time.perf_counter() - started
        store.close()
    counts = Counter(result.family for result in campaign.results.values())
    closed = sum(result.failed_closed for result in campaign.results.values())
    shown_counts = ", ".join(f"{name} {counts[name]}" for name in sorted(counts))
    stream.write(
        f"{backend}: {len(campaign.results)} seeds in {campaign.seconds:.1f} s "
        f"({campaign.seeds_per_second:.2f} seeds/s); families: {shown_counts or 'none'}; "
        f"{closed} typed refusals (failed closed, as required)\n"
    )
    stream.write(campaign.closing_line() + "\n")
    stream.flush()
    return campaign


def _kill_children() -> None:
    """SIGKILL this process's children (a stuck seed's workers, proxies and private servers)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if parent == me:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _watch(seed: int, stream: TextIO, command: str, seconds: int) -> None:
    """Arm (``seconds`` > 0) or disarm the stuck-seed watchdog: a hang is a finding, never a silent stall."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)
        return

    def stuck(signum: int, frame: object) -> None:
        stream.write(f"seed {seed} is stuck: still running after {seconds} s; its stacks follow\n")
        stream.write(f"  reproduce: {command}\n")
        stream.flush()
        faulthandler.dump_traceback(all_threads=True)
        _kill_children()
        os._exit(3)

    signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mayfly_contract.sim",
        description=(
            "Deterministic seeded simulation: generated workflows under crash, storage, lease and time "
            "faults, with invariants checked after every step. Prints `N seeds, V violations` last."
        ),
    )
    parser.add_argument(
        "--backend", required=True, choices=BACKENDS, help="the journal backend to simulate on"
    )
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run (default 1000)")
    parser.add_argument(
        "--seed", type=int, default=None, help="run only this seed (with --seeds N: seeds S .. S+N-1)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="workers per seed, for the families that use them"
    )
    parser.add_argument(
        "--family", default=None, help="run only this seed family (crash, storage, lease, ...)"
    )
    parser.add_argument(
        "--url", default=None, help="PostgreSQL or Redis URL to use instead of the loopback default"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where file and LMDB stores go (default: a temp dir)"
    )
    parser.add_argument(
        "--seed-timeout",
        type=int,
        default=SEED_TIMEOUT_S,
        help=f"seconds after which a seed counts as stuck: exit 3 (default {SEED_TIMEOUT_S}; 0: never)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the campaign the command line describes; 0 when no violation was found, 1 otherwise."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.workers < 1:
        parser.error("--seeds and --workers must be at least 1")
    if args.family is not None and args.family not in {
        f.name for f in families_for(args.backend, args.workers)
    }:
        names = ", ".join(f.name for f in families_for(args.backend, args.workers))
        parser.error(f"no family {args.family!r} runs on {args.backend}; choose one of {names}")
    # A simulated death abandons connections mid-call; their drivers' complaints when they are collected
    # are expected noise, not findings (findings are the violations the seeds report).
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    explicit = args.seed is not None
    if explicit and "--seeds" not in (argv if argv is not None else sys.argv[1:]):
        seeds: Sequence[int] = [args.seed]
    else:
        start = args.seed if explicit else 0
        seeds = range(start, start + args.seeds)
    campaign = run_campaign(
        args.backend,
        seeds,
        workers=args.workers,
        family=args.family,
        url=args.url,
        directory=args.dir,
        seed_timeout_s=args.seed_timeout,
    )
    return 1 if campaign.violations else 0
