"""`mayfly ui` on PostgreSQL: the run list pages through the run index, chromium opens a real run page."""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import drop_schema, with_options

# The console's test helpers (real runs with payload canaries, the server process, chromium) are the core's.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "mayfly" / "tests" / "console"))

from console_runs import (  # after the path above
    CANARIES,
    QUEUE,
    Runs,
    Served,
    crawl_everything,
    dump_dom,
    fetch,
    graph_nodes,
    hold_a_run,
    lease_rows,
    make_runs,
    png_pixels,
    rgb,
    screenshot,
    start_ui,
    wait_for_lease,
    walk_list,
)

from mayfly.console import STATE_COLOURS


@pytest.fixture(scope="module")
def runs(server: str) -> Iterator[Runs]:
    schema = f"console_{uuid.uuid4().hex[:10]}"
    url = with_options(server, schema=schema)
    try:
        yield make_runs(url)
    finally:
        drop_schema(server, schema)


@pytest.fixture(scope="module")
def served(runs: Runs) -> Iterator[Served]:
    server = start_ui(runs.url)
    try:
        yield server
    finally:
        server.stop()


def test_the_run_list_comes_from_the_index_newest_first_and_pages_with_a_keyset_cursor(
    runs: Runs, served: Served
) -> None:
    """The list says it is ordered by update; pages of two list every run once, with filters applied."""
    status, _, page = fetch(served.url + "/runs")
    assert status == 200 and "most recently updated first" in page
    rows = dict(re.findall(r'<tr data-run="([^"]+)" data-status="([^"]+)"', page))
    assert set(rows) == set(runs.all)
    assert rows[runs.waiting] == "waiting" and rows[runs.failed] == "failed"
    seen, pages = walk_list(served.url, "/runs?limit=2")
    assert sorted(seen) == sorted(runs.all) and pages >= 4
    seen, _ = walk_list(served.url, "/runs?limit=1&state=succeeded")
    assert sorted(seen) == sorted([runs.review, runs.approved, runs.parent, runs.child])
    seen, _ = walk_list(served.url, "/runs?limit=1&state=waiting")
    assert seen == [runs.waiting]
    seen, _ = walk_list(served.url, f"/runs?limit=1&queue={QUEUE}")
    assert seen == [runs.queued]
    assert fetch(served.url + "/runs?cursor=r~abc")[0] == 400  # a file-journal cursor is not this one's


def test_chromium_opens_the_list_and_a_run_page_on_postgresql(
    runs: Runs, served: Served, tmp_path: Path
) -> None:
    """Headless chromium renders the list and the review run; nodes carry their state colours."""
    dom = dump_dom(tmp_path / "profile-list", served.url + "/runs")
    assert set(re.findall(r'<tr data-run="([^"]+)"', dom)) == set(runs.all)
    dom = dump_dom(tmp_path / "profile-run", served.url + f"/runs/{runs.review}")
    nodes = graph_nodes(dom)
    assert set(nodes) == {"plan", "implement", "review", "qa", "publish"}
    assert all(fill == STATE_COLOURS[state].fill for state, fill in nodes.values())
    assert 'class="edge correction" data-from="review" data-to="implement"' in dom
    shot = tmp_path / "console-run-postgres.png"
    screenshot(tmp_path / "profile-shot", served.url + f"/runs/{runs.failed}", shot)
    width, height, colours = png_pixels(shot)
    assert (width, height) == (1280, 900)
    assert rgb(STATE_COLOURS["failed"].fill) in colours and rgb(STATE_COLOURS["succeeded"].fill) in colours


def test_the_waiting_run_refreshes_and_the_workers_page_shows_the_queue(runs: Runs, served: Served) -> None:
    """state.json says waiting for the parked run; the queue with limits has its new run counted."""
    _, _, body = fetch(served.url + f"/runs/{runs.waiting}/state.json")
    assert json.loads(body)["status"] == "waiting"
    _, _, page = fetch(served.url + "/workers")
    row = page.split(f'<tr data-queue="{QUEUE}">', 1)[1].split("</tr>", 1)[0]
    assert '<td data-count="new">1</td>' in row


def test_no_payload_reaches_any_page_on_postgresql(runs: Runs, served: Served) -> None:
    """Canary: no input, output, token or decision appears in any page, asset or endpoint."""
    pages = crawl_everything(served.url, runs)
    assert len(pages) > 40
    for path, body in pages.items():
        for canary in CANARIES:
            assert canary not in body, f"{canary} leaked into {path}"


def test_the_workers_page_shows_a_worker_s_lease_with_its_expiry_on_postgresql(
    server: str, tmp_path: Path
) -> None:
    """A real `mayfly worker` driving a run on PostgreSQL: /workers lists its lease with the worker's id,
    the token and the time to expiry on the server's clock (renewed, so never past its ttl); chromium
    renders the row; no payload shows; the lease is gone once the run ended."""
    schema = f"console_lease_{uuid.uuid4().hex[:10]}"
    url = with_options(server, schema=schema)
    try:
        held = hold_a_run(url, tmp_path / "release")
        served = start_ui(url)
        try:
            owner, token, left, text = wait_for_lease(served.url, held)
            assert owner == held.owner and token >= 1
            assert left is not None and 0 < left <= 30_000  # the worker's lease ttl
            assert re.search(r"\d+(\.\d)? (ms|s) unless renewed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", text)
            dom = dump_dom(tmp_path / "profile-workers", served.url + "/workers")
            assert lease_rows(dom)[held.run_id][:2] == (held.owner, token)
            for body in (dom, fetch(served.url + "/workers")[2]):
                for canary in CANARIES:
                    assert canary not in body
            held.stop()
            assert held.run_id not in lease_rows(fetch(served.url + "/workers")[2])
        finally:
            held.release.touch()
            if held.process.poll() is None:
                held.process.kill()
                held.process.wait()
            served.stop()
    finally:
        drop_schema(server, schema)
