"""`mayfly ui` on the file journal: a real server process, crawled over HTTP and opened in headless chromium."""

from __future__ import annotations

import html
import io
import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from console_runs import (
    CANARIES,
    DECISION_CANARY,
    FAIL_REASON,
    QUEUE,
    REVIEW_REASON,
    SIGNAL_TOKEN,
    WRITE_TOKEN,
    Runs,
    Served,
    approval_spec,
    crawl_everything,
    dump_dom,
    fetch,
    graph_nodes,
    hold_a_run,
    lease_rows,
    make_runs,
    open_browser,
    png_pixels,
    registry,
    rgb,
    screenshot,
    start_ui,
    wait_for_lease,
    walk_list,
)

from mayfly import WorkflowRuntime
from mayfly.cli import main
from mayfly.console import STATE_COLOURS, render_graph
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.signals import SignalToken
from mayfly.model.spec import Edge, Node, OnOutcome


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("console")
    return make_runs(f"file://{root}/journal")


@pytest.fixture(scope="module")
def served(runs: Runs) -> Iterator[Served]:
    server = start_ui(runs.url)
    try:
        yield server
    finally:
        server.stop()


def test_the_run_list_shows_every_run_with_its_status_and_filters_by_state_workflow_and_queue(
    runs: Runs, served: Served
) -> None:
    """The list shows all runs; state, workflow and queue filters keep only matching rows."""
    status, kind, page = fetch(served.url + "/runs")
    assert status == 200 and kind.startswith("text/html")
    rows = dict(re.findall(r'<tr data-run="([^"]+)" data-status="([^"]+)"', page))
    assert set(rows) == set(runs.all)
    assert rows[runs.review] == "succeeded" and rows[runs.waiting] == "waiting"
    assert rows[runs.failed] == "failed" and rows[runs.queued] == "running"

    def listed(**query: str) -> set[str]:
        code, _, body = fetch(served.url + "/runs?" + urlencode(query))
        assert code == 200
        return set(re.findall(r'<tr data-run="([^"]+)"', body))

    assert listed(state="waiting") == {runs.waiting}
    assert listed(state="running") == {runs.waiting, runs.queued}
    assert listed(workflow="console.approval") == {runs.waiting, runs.approved, runs.queued}
    assert listed(queue=QUEUE) == {runs.queued}
    assert listed(state="failed", workflow="console.review") == set()
    assert fetch(served.url + "/runs?state=bogus")[0] == 400
    assert fetch(served.url + "/runs?cursor=nonsense")[0] == 400


def test_the_run_list_pages_with_a_cursor_and_every_run_appears_once(runs: Runs, served: Served) -> None:
    """Pages of two runs follow the next-page cursor; together they list each run once."""
    seen, pages = walk_list(served.url, "/runs?limit=2")
    assert sorted(seen) == sorted(runs.all) and pages >= 4


def test_a_run_page_draws_the_graph_coloured_by_node_state_with_the_correction_loop(
    runs: Runs, served: Served
) -> None:
    """The review run's SVG has every node, coloured by state, and the review -> implement loop."""
    status, _, page = fetch(served.url + f"/runs/{runs.review}")
    assert status == 200
    nodes = graph_nodes(page)
    assert set(nodes) == {"plan", "implement", "review", "qa", "publish"}
    for state, fill in nodes.values():
        assert state == "succeeded" and fill == STATE_COLOURS[state].fill
    assert 'class="edge correction" data-from="review" data-to="implement"' in page
    assert REVIEW_REASON in html.unescape(page)  # bounded reasons are the operator-safe channel
    assert 'data-refresh="' not in page  # an ended run is not refreshed


def test_a_failed_run_shows_failed_and_blocked_nodes_and_the_reason(runs: Runs, served: Served) -> None:
    """Each node's data-state and fill follow its state; the permanent failure's reason is shown."""
    _, _, page = fetch(served.url + f"/runs/{runs.failed}")
    nodes = graph_nodes(page)
    assert nodes["fetch"] == ("succeeded", STATE_COLOURS["succeeded"].fill)
    assert nodes["build"] == ("failed", STATE_COLOURS["failed"].fill)
    assert nodes["ship"][0] in ("blocked", "skipped", "cancelled")
    assert nodes["ship"][1] == STATE_COLOURS[nodes["ship"][0]].fill
    assert FAIL_REASON in html.unescape(page)


def test_a_child_call_links_to_the_child_run_and_the_child_back_to_its_parent(
    runs: Runs, served: Served
) -> None:
    """The calling node is a link to the child run's page, which names its parent."""
    _, _, page = fetch(served.url + f"/runs/{runs.parent}")
    assert f'<a class="child-link" href="/runs/{runs.child}"' in page
    assert 'class="node child-call" data-node="lint"' in page
    status, _, child = fetch(served.url + f"/runs/{runs.child}")
    assert status == 200 and f'href="/runs/{runs.parent}"' in child
    assert graph_nodes(child) == {"scan": ("succeeded", STATE_COLOURS["succeeded"].fill)}


def test_a_waiting_run_shows_its_wait_and_deadline_and_refreshes_while_in_progress(
    runs: Runs, served: Served
) -> None:
    """The waits table names the signal and its expiry; the page polls state.json, which says waiting."""
    _, _, page = fetch(served.url + f"/runs/{runs.waiting}")
    assert graph_nodes(page)["approval"] == ("waiting", STATE_COLOURS["waiting"].fill)
    waits = page.split('<table class="waits">', 1)[1].split("</table>", 1)[0]
    assert 'data-node="approval"' in waits and "<td>approval</td>" in waits
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", waits)
    assert f'data-refresh="/runs/{runs.waiting}/state.json"' in page
    status, kind, body = fetch(served.url + f"/runs/{runs.waiting}/state.json")
    state = json.loads(body)
    assert status == 200 and kind == "application/json"
    assert state["status"] == "waiting" and state["terminal"] is False
    assert state["nodes"] == {"draft": "succeeded", "approval": "waiting", "publish": "pending"}
    assert "<form" not in page.split("<main>", 1)[1].replace('<form class="filters"', "")  # writes are off
    form = urlencode({"node": "approval", "token": SIGNAL_TOKEN, "decision": "approve", "confirm": "yes"})
    kind = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = fetch(served.url + f"/runs/{runs.waiting}/signal", form.encode(), kind)
    assert status == 403 and "write actions are off" in body


def test_the_timeline_pages_through_the_whole_history(runs: Runs, served: Served) -> None:
    """The history pages, 100 events each, together hold every sequence from 1 to the last once."""
    _, _, body = fetch(served.url + f"/runs/{runs.review}/state.json")
    last = json.loads(body)["sequence"]
    sequences: list[int] = []
    path = f"/runs/{runs.review}/history"
    while path:
        _, _, page = fetch(served.url + path)
        sequences.extend(int(s) for s in re.findall(r'<tr data-sequence="(\d+)"', page))
        found = re.search(r'<a class="next" rel="next" href="([^"]+)"', page)
        path = html.unescape(found.group(1)) if found else ""
    assert sequences == list(range(1, last + 1))
    _, _, page = fetch(served.url + f"/runs/{runs.review}/history?after=10")
    assert re.findall(r'<tr data-sequence="(\d+)"', page)[0] == "11"


def test_the_workers_page_shows_queue_limits_usage_and_depth(runs: Runs, served: Served) -> None:
    """The queue with limits shows them; its submitted, unclaimed run counts as new."""
    status, _, page = fetch(served.url + "/workers")
    assert status == 200
    row = page.split(f'<tr data-queue="{QUEUE}">', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    assert cells[:5] == [QUEUE, "4", "-", "10/1s", "fifo"]
    assert '<td data-count="new">1</td>' in row


def test_the_workers_page_shows_who_holds_a_lease_in_chromium_and_forgets_it_once_released(
    tmp_path: Path,
) -> None:
    """A real `mayfly worker` process driving a run holds its lease: /workers lists the run (linked), the
    worker's id as owner, the token and that the lease lasts until released; chromium renders the row;
    no payload shows; once the run ends the lease is gone from the page."""
    url = f"file://{tmp_path}/journal"
    held = hold_a_run(url, tmp_path / "release")
    served = start_ui(url)
    try:
        owner, token, left, text = wait_for_lease(served.url, held)
        assert (owner, token, left) == (held.owner, 1, None)
        assert "held until released or its process ends" in text
        dom = dump_dom(tmp_path / "profile-workers", served.url + "/workers")
        assert lease_rows(dom)[held.run_id][:2] == (held.owner, 1)
        assert f'<a class="mono run-link" href="/runs/{held.run_id}">' in dom
        _, _, page = fetch(served.url + "/workers")
        for body in (dom, page):
            for canary in CANARIES:
                assert canary not in body
        assert fetch(served.url + "/workers?after=nonsense")[0] == 400
        _, _, later = fetch(served.url + f"/workers?after={held.run_id}")
        assert held.run_id not in lease_rows(later)  # the next page starts after it
        held.stop()
        _, _, page = fetch(served.url + "/workers")
        assert held.run_id not in lease_rows(page) and "No run is leased now." in page
    finally:
        held.release.touch()
        if held.process.poll() is None:
            held.process.kill()
            held.process.wait()
        served.stop()


def test_no_payload_reaches_any_page_the_console_serves(runs: Runs, served: Served) -> None:
    """Canary: inputs, outputs, signal tokens and decisions appear in no page, asset or endpoint."""
    pages = crawl_everything(served.url, runs)
    assert len(pages) > 40
    for path, body in pages.items():
        for canary in CANARIES:
            assert canary not in body, f"{canary} leaked into {path}"


def test_the_server_answers_malformed_and_oversized_requests_and_keeps_connections_alive(
    served: Served,
) -> None:
    """400, 404, 405, 413 and 431 for bad requests; two requests share one kept-alive connection."""
    host, port = served.url.removeprefix("http://").split(":")

    def exchange(raw: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw)
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)

    assert exchange(b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert exchange(b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 404 "
    )
    assert exchange(b"PUT /runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    big = b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n"
    assert exchange(big).startswith(b"HTTP/1.1 413 ")
    huge = b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    assert exchange(huge).startswith(b"HTTP/1.1 431 ")
    two = (
        b"GET /static/console.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"HEAD /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    answer = exchange(two)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and b"Connection: keep-alive" in answer
    rebound = exchange(b"GET /runs HTTP/1.1\r\nHost: evil.example:8080\r\nConnection: close\r\n\r\n")
    assert rebound.startswith(b"HTTP/1.1 400 ") and b"tr data-run" not in rebound  # DNS rebinding
    local = b"GET /runs HTTP/1.1\r\nHost: localhost:1\r\nConnection: close\r\n\r\n"
    assert exchange(local).startswith(b"HTTP/1.1 200 ")
    assert fetch(served.url + f"/runs/{uuid.uuid4()}")[0] == 404
    assert fetch(served.url + "/runs/not-a-run")[0] == 404
    # One connection per hub task: a client stalled mid-request does not hold up another.
    with socket.create_connection((host, int(port)), timeout=10) as stalled:
        stalled.sendall(b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert fetch(served.url + "/static/console.css")[0] == 200
        stalled.sendall(b"Connection: close\r\n\r\n")
        assert stalled.recv(64).startswith(b"HTTP/1.1 200 OK")


def test_chromium_opens_the_run_list_and_a_run_page_and_sees_the_state_colours(
    runs: Runs, served: Served, tmp_path: Path
) -> None:
    """Headless chromium renders both pages; the screenshot holds each node state's fill colour."""
    dom = dump_dom(tmp_path / "profile-list", served.url + "/runs")
    assert set(re.findall(r'<tr data-run="([^"]+)"', dom)) == set(runs.all)
    dom = dump_dom(tmp_path / "profile-run", served.url + f"/runs/{runs.failed}")
    nodes = graph_nodes(dom)
    assert {state for state, _ in nodes.values()} >= {"succeeded", "failed"}
    for state, fill in nodes.values():
        assert fill == STATE_COLOURS[state].fill
    shot = tmp_path / "console-run.png"
    screenshot(tmp_path / "profile-shot", served.url + f"/runs/{runs.failed}", shot)
    width, height, colours = png_pixels(shot)
    assert (width, height) == (1280, 900)
    for state, _ in nodes.values():
        assert rgb(STATE_COLOURS[state].fill) in colours, f"no {state} pixels in the screenshot"
    for canary in CANARIES:
        assert canary not in dom


def test_write_actions_need_the_token_and_a_confirmation_and_echo_nothing(tmp_path: Path) -> None:
    """With --allow-writes a signal or cancel needs the token, a confirmation and a same-origin post."""
    runs = make_runs(f"file://{tmp_path}/journal")  # its own runs: this test changes them
    token_file = tmp_path / "token"
    token_file.write_text(WRITE_TOKEN + "\n")
    token_file.chmod(0o600)
    served = start_ui(runs.url, "--allow-writes", "--token-file", str(token_file))
    try:
        _, _, page = fetch(served.url + f"/runs/{runs.waiting}")
        assert 'action="/runs/' + runs.waiting + '/signal"' in page and WRITE_TOKEN not in page
        target = served.url + f"/runs/{runs.waiting}/signal"
        form = {"node": "approval", "token": SIGNAL_TOKEN, "decision": DECISION_CANARY, "confirm": "yes"}
        kind = {"Content-Type": "application/x-www-form-urlencoded"}

        def post(fields: dict[str, str], headers: dict[str, str] | None = None) -> tuple[int, str, str]:
            return fetch(target, urlencode(fields).encode(), {**kind, **(headers or {})})

        refusals = [
            post(form),
            post({**form, "console_token": "wrong-token-wrong-token"}),
            post({**form, "console_token": WRITE_TOKEN, "confirm": ""}),
            post({**form, "console_token": WRITE_TOKEN}, {"Origin": "http://evil.example"}),
        ]
        assert [code for code, _, _ in refusals] == [403, 403, 400, 403]
        for _, _, body in refusals:
            assert all(canary not in body for canary in CANARIES)
        _, _, body = fetch(served.url + f"/runs/{runs.waiting}/state.json")
        assert json.loads(body)["nodes"]["approval"] == "waiting"  # nothing was delivered
        code, _, _ = post({**form, "console_token": WRITE_TOKEN})
        assert code == 303
        _, _, page = fetch(served.url + f"/runs/{runs.waiting}?notice=signal-accepted")
        assert "Signal accepted." in page and all(canary not in page for canary in CANARIES)
        _, _, body = fetch(served.url + f"/runs/{runs.waiting}/state.json")
        assert json.loads(body)["nodes"]["approval"] != "waiting"  # the signal was recorded
        cancel = served.url + f"/runs/{runs.queued}/cancel"
        fields = {"reason": "not needed", "confirm": "yes"}
        assert fetch(cancel, urlencode(fields).encode(), kind)[0] == 403
        code, _, _ = fetch(cancel, urlencode({**fields, "console_token": WRITE_TOKEN}).encode(), kind)
        assert code == 303
        _, _, body = fetch(served.url + f"/runs/{runs.queued}/state.json")
        assert json.loads(body)["status"] == "cancelled"
        code, _, _ = fetch(cancel, urlencode({**fields, "console_token": WRITE_TOKEN}).encode(), kind)
        assert code == 409  # an ended run accepts no more commands
    finally:
        out = served.stop()
    assert all(canary not in out for canary in CANARIES)


def test_the_graph_layout_puts_dependencies_left_to_right_and_draws_loops_as_arcs() -> None:
    """A depends_on chain is laid out in columns; an edge back to an earlier node is a correction arc."""
    nodes = (Node("a", handler="a@1"), Node("b", handler="b@1", depends_on=("a",)), Node("c", handler="c@1"))
    edges = (
        Edge("b", "c", when=OnOutcome(NodeOutcomeKind.SUCCEEDED)),
        Edge("c", "b", when=OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)),
    )
    svg = render_graph(nodes, edges, ())
    xs = [
        int(x)
        for x in re.findall(
            r'<g class="node" data-node="[abc]" data-state="pending"><title>[^<]*</title><rect x="(\d+)"', svg
        )
    ]
    assert xs == sorted(xs) and len(set(xs)) == 3
    assert svg.count('class="edge correction"') == 1 and 'data-from="c" data-to="b"' in svg
    assert svg.count('class="edge dependency"') == 1 and svg.count('class="edge conditional"') == 1


def test_mayfly_ui_refuses_bad_flags_an_unsafe_token_file_and_a_missing_journal(tmp_path: Path) -> None:
    """Usage errors exit 2 and a missing journal exits 5, each as one line, before anything is served."""
    out, err = io.StringIO(), io.StringIO()

    def ui(*args: str) -> tuple[int, str]:
        err.seek(0)
        err.truncate()
        code = main(["ui", "--journal", f"file://{tmp_path}/none", *args], out=out, err=err)
        return code, err.getvalue()

    code, message = ui("--allow-writes")
    assert code == 2 and "go together" in message
    assert ui("--port", "70000")[0] == 2 and ui("--host", "localhost:80")[0] == 2
    loose = tmp_path / "loose"
    loose.write_text(WRITE_TOKEN)
    loose.chmod(0o644)
    code, message = ui("--allow-writes", "--token-file", str(loose))
    assert code == 2 and "chmod 600" in message and WRITE_TOKEN not in message
    short = tmp_path / "short"
    short.write_text("tiny")
    short.chmod(0o600)
    assert "at least 16 characters" in ui("--allow-writes", "--token-file", str(short))[1]
    code, message = ui()
    assert code == 5 and "no journal at" in message and message.count("\n") == 1
    assert out.getvalue() == ""


def test_a_run_page_open_in_chromium_reloads_itself_when_the_run_moves_on(tmp_path: Path) -> None:
    """Live refresh: a page opened while the run waits polls state.json and reloads once it was signalled."""
    url = f"file://{tmp_path}/journal"
    runtime = WorkflowRuntime(url, registry())
    parked = runtime.execute(approval_spec(), input={"ticket": "live"})
    log = tmp_path / "ui.log"
    served = start_ui(url, "--access-log", log=log)
    try:
        _, _, body = fetch(served.url + f"/runs/{parked.run_id}/state.json")
        assert json.loads(body)["status"] == "waiting"
        polls = log.read_text().count("state.json")
        # An hour of the page's virtual time: it polls every 2 s (virtual), each poll a real request.
        page = served.url + f"/runs/{parked.run_id}"
        browser = open_browser(tmp_path / "profile", "--virtual-time-budget=3600000", "--dump-dom", page)
        deadline = time.monotonic() + 60
        while log.read_text().count("state.json") < polls + 2:  # the page loaded and is polling
            assert time.monotonic() < deadline and browser.poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
        assert (
            runtime.signal(parked.run_id, "approval", SignalToken(SIGNAL_TOKEN), "approve").status
            == "accepted"
        )
        assert runtime.resume(parked.run_id).succeeded
        dom, _ = browser.communicate(timeout=120)
    finally:
        served.stop()
        runtime.journal.close()
    assert browser.returncode == 0
    shown = re.search(r"<body[^>]*>", dom)
    assert shown is not None and "data-refresh" not in shown.group(0)  # reloaded as an ended run
    assert graph_nodes(dom)["publish"] == ("succeeded", STATE_COLOURS["succeeded"].fill)


def test_metrics_serves_the_prometheus_text_of_the_journal(runs: Runs, served: Served) -> None:
    """``/metrics`` parses with Prometheus's own text parser and counts the journal's runs."""
    from prometheus_client.parser import text_string_to_metric_families  # a test-only dependency

    status, content_type, body = fetch(served.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {family.name: family for family in text_string_to_metric_families(body)}
    (observed,) = families["mayfly_runs_observed"].samples
    assert observed.value == len(runs.all)
