"""Real runs for the console tests, with canary strings in every payload, and a console to crawl.

(A helper module, not a conftest: the core tests import the root conftest by name.)

Inputs, outputs, signal tokens and decisions carry canaries that must never
appear in any page the console serves. The runs, all driven by the real
runtime on a real journal: a review with a correction loop and a retried QA
step (succeeded), an approval parked on its signal wait (waiting), an
approval signalled with a canary decision (succeeded), a parent calling a
child run (succeeded), a run that fails permanently, and a submitted run on
a queue with limits that no worker has claimed (new).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from mayfly import (
    ChangesRequested,
    ChildCall,
    ChildDefinition,
    Edge,
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    NodeOutcome,
    NodeOutcomeKind,
    OnOutcome,
    PermanentFailure,
    RetryableFailure,
    RetryPolicy,
    Succeeded,
    WorkflowRuntime,
    WorkflowSpec,
)
from mayfly.model.signals import SignalToken
from mayfly.queues import QUEUE_CONTROL, QueueSettings
from mayfly.runtime import WaitForSignal

RUN_INPUT_CANARY: Final = "CANARY-CONSOLE-RUN-INPUT-c41d"
NODE_INPUT_CANARY: Final = "CANARY-CONSOLE-NODE-INPUT-77ab"
OUTPUT_CANARY: Final = "CANARY-CONSOLE-OUTPUT-e02f"
SIGNAL_TOKEN: Final = "CANARY-CONSOLE-TOKEN-9b3e"
DECISION_CANARY: Final = "CANARY-CONSOLE-DECISION-5a60"
CHILD_CANARY: Final = "CANARY-CONSOLE-CHILD-0c8d"
WRITE_TOKEN: Final = "console-write-token-CANARY-f1e2d3"

CANARIES: Final = (
    RUN_INPUT_CANARY,
    NODE_INPUT_CANARY,
    OUTPUT_CANARY,
    SIGNAL_TOKEN,
    DECISION_CANARY,
    CHILD_CANARY,
    WRITE_TOKEN,
    "CANARY",  # every canary shares this stem: no part of any of them may show
)
"""Payload strings (and the console's write token): never in any page the console serves."""

REVIEW_REASON: Final = "needs tests REASON-REVIEW-44"
QA_REASON: Final = "flaky runner REASON-QA-12"
FAIL_REASON: Final = "repository is archived REASON-FAIL-9"
QUEUE: Final = "console-q"

CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""The flags that let Debian's chromium run headless on a closed network."""


def review_spec() -> WorkflowSpec:
    """plan -> implement -> review (loops back once on changes requested) -> qa (retried once) -> publish."""
    return WorkflowSpec(
        workflow_id="console.review",
        version=1,
        nodes=(
            Node("plan", handler="plan@1", input={"brief": NODE_INPUT_CANARY}),
            Node("implement", handler="implement@1", depends_on=("plan",)),
            Node("review", handler="review@1"),
            Node(
                "qa",
                handler="qa@1",
                depends_on=("review",),
                retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=10)),
            ),
            Node("publish", handler="publish@1", depends_on=("qa",)),
        ),
        edges=(
            Edge("implement", "review", when=OnOutcome(NodeOutcomeKind.SUCCEEDED)),
            Edge("review", "implement", when=OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)),
        ),
        initial=("plan",),
    )


def approval_spec() -> WorkflowSpec:
    """draft -> approval (a signal wait with a one-hour deadline) -> publish."""
    return WorkflowSpec(
        workflow_id="console.approval",
        version=1,
        nodes=(
            Node("draft", handler="draft@1", input={"secret": NODE_INPUT_CANARY}),
            Node("approval", handler="approval@1", depends_on=("draft",)),
            Node("publish", handler="publish@1", depends_on=("approval",)),
        ),
    )


LINT: Final = ChildDefinition(
    "console.lint",
    1,
    (Node("scan", handler="scan@1", outputs=("warnings",)),),
    inputs=("repo",),
    outputs=("warnings",),
)


def parent_spec() -> WorkflowSpec:
    """checkout -> lint (a call of console.lint@1) -> report."""
    return WorkflowSpec(
        "console.ci",
        1,
        (
            Node("checkout", handler="checkout@1", outputs=("repo",)),
            Node(
                "lint",
                child=ChildCall("console.lint", 1, "require_success", ("repo",), ("warnings",)),
                depends_on=("checkout",),
            ),
            Node("report", handler="publish@1", depends_on=("lint",)),
        ),
        catalog=(LINT,),
    )


def failing_spec() -> WorkflowSpec:
    """fetch -> build (fails permanently) -> ship (blocked by it)."""
    return WorkflowSpec(
        "console.fails",
        1,
        (
            Node("fetch", handler="draft@1"),
            Node("build", handler="broken@1", depends_on=("fetch",)),
            Node("ship", handler="publish@1", depends_on=("build",)),
        ),
    )


def registry() -> HandlerRegistry:
    """Handlers whose outputs carry the output canary; review and qa each fail once."""
    handlers = HandlerRegistry()
    calls: dict[tuple[str, str], int] = {}

    def count(req: HandlerRequest) -> int:
        key = (req.run_id, req.node_id)
        calls[key] = calls.get(key, 0) + 1
        return calls[key]

    @handlers.handler("plan")
    def plan(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"plan": OUTPUT_CANARY, "echo": req.input})

    @handlers.handler("implement")
    def implement(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"diff": f"{OUTPUT_CANARY}-{count(req)}", "run": req.run_input})

    @handlers.handler("review")
    def review(req: HandlerRequest) -> NodeOutcome:
        if count(req) == 1:
            return ChangesRequested(reason=REVIEW_REASON)
        return Succeeded(output={"verdict": OUTPUT_CANARY})

    @handlers.handler("qa")
    def qa(req: HandlerRequest) -> NodeOutcome:
        if count(req) == 1:
            return RetryableFailure(reason=QA_REASON)
        return Succeeded(output=OUTPUT_CANARY)

    @handlers.handler("publish")
    def publish(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"url": OUTPUT_CANARY})

    @handlers.handler("draft")
    def draft(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"text": OUTPUT_CANARY})

    @handlers.handler("approval")
    def approval(req: HandlerRequest) -> NodeOutcome | WaitForSignal:
        if req.signal is None:
            return WaitForSignal("approval", SignalToken(SIGNAL_TOKEN), timeout_ms=3_600_000)
        return Succeeded(output={"decision": req.signal.decision})

    @handlers.handler("broken")
    def broken(req: HandlerRequest) -> NodeOutcome:
        return PermanentFailure(reason=FAIL_REASON)

    @handlers.handler("checkout")
    def checkout(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"repo": CHILD_CANARY})

    @handlers.handler("scan")
    def scan(req: HandlerRequest) -> NodeOutcome:
        return Succeeded(output={"warnings": f"{CHILD_CANARY} {req.input}"})

    return handlers


@dataclass
class Runs:
    """The journal URL and the ids of the runs :func:`make_runs` made."""

    url: str
    review: str
    waiting: str
    approved: str
    parent: str
    child: str
    failed: str
    queued: str
    all: list[str] = field(default_factory=list)


def make_runs(url: str) -> Runs:
    """Drive every console test run on the journal at ``url`` (see the module docstring)."""
    runtime = WorkflowRuntime(url, registry())
    try:
        review = runtime.execute(review_spec(), input={"ticket": RUN_INPUT_CANARY})
        assert review.succeeded
        waiting = runtime.execute(approval_spec(), input={"ticket": RUN_INPUT_CANARY})
        assert waiting.waiting == {"approval": "approval"}
        approved = runtime.execute(approval_spec(), input={"ticket": RUN_INPUT_CANARY})
        disposition = runtime.signal(
            approved.run_id, "approval", SignalToken(SIGNAL_TOKEN), {"decision": DECISION_CANARY, "by": "me"}
        )
        assert disposition.status == "accepted"
        assert runtime.resume(approved.run_id).succeeded
        parent = runtime.execute(parent_spec(), input={"repo": CHILD_CANARY})
        assert parent.succeeded
        child = parent.nodes["lint"].child_run_id
        assert child is not None
        failed = runtime.execute(failing_spec(), input={"ticket": RUN_INPUT_CANARY})
        assert not failed.succeeded
        control = QUEUE_CONTROL.of(runtime.journal)
        assert control is not None
        control.queue_set(QueueSettings(name=QUEUE, concurrency=4, rate_limit=10, rate_period_ms=1_000))
        queued = runtime.start(approval_spec(), {"ticket": RUN_INPUT_CANARY}, queue=QUEUE).run_id
    finally:
        runtime.journal.close()
    ids = [review.run_id, waiting.run_id, approved.run_id, parent.run_id, str(child), failed.run_id, queued]
    return Runs(url, ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids)


# -- a real worker holding a run's lease ------------------------------------------------

HOLD_QUEUE: Final = "console-hold"
HANDLERS: Final = Path(__file__).resolve().parent / "console_handlers.py"


def hold_spec() -> WorkflowSpec:
    """One node, ``hold@1``, which the worker runs until the test releases it (console_handlers.py)."""
    return WorkflowSpec("console.hold", 1, (Node("hold", handler="hold@1", input={"n": NODE_INPUT_CANARY}),))


@dataclass
class HeldRun:
    """A ``mayfly worker`` process driving one submitted run whose handler holds until released."""

    process: subprocess.Popen[str]
    run_id: str
    release: Path

    @property
    def owner(self) -> str:
        """The owner the worker's leases carry: its default, ``HOST:PID``."""
        return f"{socket.gethostname()}:{self.process.pid}"

    def stop(self) -> str:
        """Let the handler finish, SIGTERM the worker and return what it wrote; it must exit 0."""
        self.release.touch()
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, (self.process.returncode, err[-3000:])
        return err


def hold_a_run(url: str, release: Path) -> HeldRun:
    """Submit a ``hold`` run to :data:`HOLD_QUEUE` and start a worker serving that queue, which claims it."""
    runtime = WorkflowRuntime(url, HandlerRegistry())
    try:
        run_id = runtime.start(hold_spec(), {"ticket": RUN_INPUT_CANARY}, queue=HOLD_QUEUE).run_id
    finally:
        runtime.journal.close()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mayfly",
            "--journal",
            url,
            "worker",
            "--json",
            "--handlers",
            str(HANDLERS),
            "--queue",
            HOLD_QUEUE,
            "--poll-interval",
            "100",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MAYFLY_CONSOLE_RELEASE": str(release)},
    )
    return HeldRun(process, run_id, release)


_LEASE_ROW = re.compile(
    r'<tr data-lease="([^"]+)" data-owner="([^"]*)" data-token="(\d+)" data-expires-in-ms="(\d*)">(.*?)</tr>'
)


def lease_rows(page: str) -> dict[str, tuple[str, int, int | None, str]]:
    """run id -> (owner, token, ms to expiry or None, the row's text) of the workers page's lease table."""
    rows = {}
    for run_id, owner, token, left, cells in _LEASE_ROW.findall(page):
        text = html.unescape(re.sub(r"<[^>]+>", " ", cells))
        rows[run_id] = (html.unescape(owner), int(token), int(left) if left else None, " ".join(text.split()))
    return rows


def wait_for_lease(base: str, held: HeldRun, timeout: float = 90) -> tuple[str, int, int | None, str]:
    """Poll ``/workers`` until it lists the held run's lease; its row."""
    deadline = time.monotonic() + timeout
    while True:
        status, _, page = fetch(base + "/workers")
        assert status == 200
        row = lease_rows(page).get(held.run_id)
        if row is not None:
            return row
        assert held.process.poll() is None, held.process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the worker's lease never showed on /workers: {page[-3000:]}"
        time.sleep(0.1)


# -- the console as a separate process -------------------------------------------------


@dataclass
class Served:
    """A ``mayfly ui`` process and the base URL it serves."""

    process: subprocess.Popen[str]
    url: str

    def stop(self) -> str:
        """SIGTERM it and return what it printed; it must exit 0."""
        self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=20)
        assert self.process.returncode == 0, (self.process.returncode, out, err)
        return out + (err or "")


def start_ui(url: str, *extra: str, log: Path | None = None) -> Served:
    """Start ``mayfly ui --journal URL --port 0`` and wait for the URL it prints.

    With ``log``, its standard error (``--access-log`` lines among it) goes to that file.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "mayfly", "ui", "--journal", url, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if log is None else log.open("w"),
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"serving (http://\S+)/runs", line)
    if found is None:
        process.kill()
        raise AssertionError(f"mayfly ui did not print its URL: {line!r} {process.communicate()}")
    return Served(process, found.group(1))


def fetch(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """GET (or POST ``data``) ``url`` without following redirects: (status, content type, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


# -- chromium ----------------------------------------------------------------------------


def chromium() -> str:
    """The chromium binary; a machine without it fails the test (``.ci/run`` installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found is not None, "chromium is not installed: apt-get install -y --no-install-recommends chromium"
    return found


def browse(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless chromium with a fresh profile under ``profile`` and ``args``."""
    profile.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(profile)}
    done = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def open_browser(profile: Path, *args: str) -> subprocess.Popen[str]:
    """Start headless chromium with a fresh profile and ``args``, without waiting for it."""
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HOME": str(profile)},
    )


def dump_dom(profile: Path, url: str) -> str:
    """The DOM of ``url`` after chromium loaded it and ran its scripts."""
    return browse(profile, "--virtual-time-budget=3000", "--dump-dom", url).stdout


def screenshot(profile: Path, url: str, path: Path) -> None:
    """Save a 1280x900 PNG of ``url``."""
    browse(profile, f"--screenshot={path}", "--window-size=1280,900", "--hide-scrollbars", url)
    assert path.is_file(), f"chromium wrote no screenshot at {path}"


def png_pixels(path: Path) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of RGB colours of a non-interlaced 8-bit RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, chunks, header = 8, [], b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        offset += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    colours: set[tuple[int, int, int]] = set()
    position = 0
    for _ in range(height):
        kind = raw[position]
        line = bytearray(raw[position + 1 : position + 1 + stride])
        position += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + best) & 0xFF
        colours.update((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
        previous = line
    return width, height, colours


def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` as a tuple."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


# -- reading pages -----------------------------------------------------------------------

_NODE = re.compile(
    r'<g class="node[^"]*" data-node="([^"]+)" data-state="([^"]+)"><title>[^<]*</title><rect [^>]*fill="(#[0-9a-f]{6})"'
)


def graph_nodes(page: str) -> dict[str, tuple[str, str]]:
    """node id -> (data-state, rect fill) of every node of the page's SVG graph."""
    return {html.unescape(n): (s, fill) for n, s, fill in _NODE.findall(page)}


def crawl(base: str, start: list[str]) -> dict[str, str]:
    """Every same-site page reachable from ``start`` (links, scripts, styles), by path."""
    seen: dict[str, str] = {}
    queue = list(start)
    while queue:
        path = queue.pop()
        if path in seen or not path.startswith("/"):
            continue
        status, _, body = fetch(base + path)
        assert status in (200, 303, 404), (path, status)
        seen[path] = body
        for found in re.findall(r'(?:href|src)="(/[^"]*)"', body):
            link = html.unescape(found)
            if link not in seen and len(seen) < 500:
                queue.append(link)
    return seen


def walk_list(base: str, path: str) -> tuple[list[str], int]:
    """The run ids of every page of the run list from ``path`` on, following the next-page links."""
    seen: list[str] = []
    pages = 0
    while path:
        status, _, body = fetch(base + path)
        assert status == 200, (path, status)
        seen.extend(re.findall(r'<tr data-run="([^"]+)"', body))
        pages += 1
        found = re.search(r'<a class="next" rel="next" href="([^"]+)"', body)
        path = html.unescape(found.group(1)) if found else ""
    return seen, pages


def crawl_everything(base: str, runs: Runs) -> dict[str, str]:
    """Every page, asset and endpoint the console serves for ``runs``, and all they link to."""
    start = ["/", "/runs", "/workers", "/metrics", "/static/console.css", "/static/console.js"]
    for run_id in runs.all:
        start += [
            f"/runs/{run_id}",
            f"/runs/{run_id}/history",
            f"/runs/{run_id}/history?after=5",
            f"/runs/{run_id}/state.json",
            f"/runs/{run_id}/graph.svg",
        ]
    for state in ("running", "waiting", "succeeded", "failed"):
        start.append(f"/runs?state={state}")
    return crawl(base, start)
