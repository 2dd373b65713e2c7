"""The console's WSGI application: server-rendered, escaped HTML over the payload-free inspection.

Routes (all ``GET`` unless said)::

    /                       redirect to /runs
    /runs                   the run list (state, workflow, queue filters; keyset paging)
    /runs/RUN               one run: graph, nodes, attempts, waits, budgets, links to child runs
    /runs/RUN/history       the run's timeline, a page at a time (?after=SEQUENCE)
    /runs/RUN/state.json    status, sequence and node states (the live refresh polls it)
    /runs/RUN/graph.svg     the graph alone
    /workers                the live leases (who owns which run, until when; ?after=RUN pages),
                            queues: limits, usage, depth by index status; claimed runs
    /metrics                Prometheus text (mayfly.telemetry.prometheus)
    /static/console.css, /static/console.js
    POST /runs/RUN/cancel, POST /runs/RUN/signal   only with write actions enabled

Nothing a handler put in a run reaches a page: run and node input, outputs,
signal decisions and tokens are never read into the pages (only outcome
kinds and the bounded reasons inspection shows). A lease's owner is what its
holder passed to ``acquire`` (a worker's id). A write action's token and
signal fields are never echoed back.
"""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from html import escape
from http import HTTPStatus
from typing import Any, Final, final
from urllib.parse import parse_qs, quote, urlencode

import msgspec

from mayfly.console._assets import CSS, JS
from mayfly.console._data import (
    BadCursor,
    HistoryPage,
    LeasePage,
    RunPage,
    WorkersView,
    history_page,
    lease_page,
    list_page,
    workers_view,
)
from mayfly.console._graph import STATE_COLOURS, render_graph
from mayfly.identity import Uuid7IdSource
from mayfly.inspect import RUN_STATES, RunInspection, build_inspection, journal_children
from mayfly.journal import WorkflowJournal, redact_url
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import (
    CommandRejected,
    CompatibilityError,
    CorruptionError,
    InvalidIdentifier,
    JournalError,
    LeaseHeld,
    MayflyError,
    RunNotFound,
)
from mayfly.model.ids import QUEUE_NAME, parse_run_id
from mayfly.model.signals import SignalToken
from mayfly.model.state import RunState
from mayfly.plugins import PluginManager, plugin_manager
from mayfly.recovery import inspect_run
from mayfly.runtime import HandlerRegistry, WorkflowRuntime, cancel_run_cascade
from mayfly.telemetry import prometheus

__all__ = ["Console"]

StartResponse = Callable[..., Callable[[bytes], object]]

_HTML: Final = "text/html; charset=utf-8"
_MAX_PAGE: Final = 200
_SECURITY_HEADERS: Final = [
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]
_MAX_FIELD: Final = 4_096
SCANNED_EVENTS: Final = 20_000
"""How many of a run's last events a run page reads for attempt numbers and times."""
_NOTICES: Final = {
    "cancelled": "Cancellation recorded.",
    "signal-accepted": "Signal accepted.",
    "signal-rejected": "Signal rejected by the run (a wrong token or signal name, or the wait expired).",
    "signal-already_consumed": "That signal was already delivered.",
}


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@final
class _Response:
    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        body: bytes | str,
        *,
        status: HTTPStatus = HTTPStatus.OK,
        content_type: str = _HTML,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.content_type = content_type
        self.headers = headers or []


def _wall(epoch_ms: int | None, virtual_ms: int | None) -> str:
    """A virtual time as UTC wall time when the run has an epoch, else the virtual milliseconds."""
    if virtual_ms is None:
        return ""
    if epoch_ms is None:
        return f"t={virtual_ms} ms"
    return _utc(epoch_ms + virtual_ms)


def _utc(unix_ms: int | None) -> str:
    if unix_ms is None:
        return ""
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{unix_ms % 1000:03d}Z"


def _duration(ms: int | None) -> str:
    if ms is None:
        return ""
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def _state_class(status: str) -> str:
    return f"st-{status}" if status in STATE_COLOURS else "st-unknown"


def _badge(status: str) -> str:
    return (
        f'<span class="badge status {_state_class(status)}" data-status="{escape(status)}">'
        f"{escape(status)}</span>"
    )


def _run_link(run_id: str) -> str:
    return f'<a class="mono run-link" href="/runs/{quote(run_id)}">{escape(run_id)}</a>'


def _legend() -> str:
    items = "".join(
        f'<li data-state="{escape(name)}"><span class="swatch {_state_class(name)}"></span>'
        f"{escape(name)}</li>"
        for name in STATE_COLOURS
    )
    loop = (
        '<li data-edge="correction"><svg width="28" height="10"><path d="M0,5 L28,5" stroke="#8e24aa" '
        'stroke-width="2" stroke-dasharray="6 4"/></svg>correction loop</li>'
        '<li data-edge="conditional"><svg width="28" height="10"><path d="M0,5 L28,5" stroke="#616161" '
        'stroke-width="1.5" stroke-dasharray="6 4"/></svg>conditional edge</li>'
        '<li data-edge="child"><span class="swatch child"></span>child call (links to the child run)</li>'
    )
    return f'<ul class="legend">{items}{loop}</ul>'


def _field(form: Mapping[str, list[str]], name: str) -> str:
    values = form.get(name, [])
    value = values[0] if values else ""
    if len(value) > _MAX_FIELD:
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"form field {name} is longer than {_MAX_FIELD} characters")
    return value


@final
class Console:
    """The read-only web console of one journal, as a WSGI application (call it with environ and start).

    ``journal`` is a journal URL, opened through ``plugins`` (default: the
    process's entry-point manager). ``write_token`` enables the signal and
    cancel actions: each POST must carry it and a confirmation; ``None``
    (the default) serves no write action at all. A request whose ``Host``
    is a name (not an IP address or ``localhost``) is refused unless it is
    in ``allowed_hosts``: a page of another site cannot reach the console by
    pointing its own name at 127.0.0.1 (DNS rebinding). Call it from a hub
    task (the server does): journal reads park on the hub as the runtime's do.
    """

    def __init__(
        self,
        journal: str,
        *,
        plugins: PluginManager | None = None,
        write_token: str | None = None,
        page_size: int = 50,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        if write_token is not None and len(write_token) < 16:
            raise ValueError(
                "the write token must be at least 16 characters; generate one with a random source"
            )
        self._plugins = plugin_manager() if plugins is None else plugins
        self._url = journal
        self._journal: WorkflowJournal = self._plugins.open_journal(journal)
        self._upcasters = self._plugins.event_upcasters()
        self._write_token = write_token
        self._page_size = page_size
        self._allowed_hosts = frozenset(name.lower() for name in allowed_hosts)
        self._runtime: WorkflowRuntime | None = None
        self._leases: RecoveryLeaseStore | None = None

    @property
    def journal(self) -> WorkflowJournal:
        """The journal the console reads."""
        return self._journal

    @property
    def writes_enabled(self) -> bool:
        """Whether the signal and cancel actions are served."""
        return self._write_token is not None

    def close(self) -> None:
        """Close the journal (and the lease store and the write runtime's stores)."""
        self._journal.close()
        if self._leases is not None:
            self._leases.close()
        if self._runtime is not None:
            self._runtime.journal.close()
            self._runtime.leases.close()

    # -- WSGI -------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Answer one request (PEP 3333)."""
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=False)
        try:
            self._check_host(environ.get("HTTP_HOST", ""))
            response = self._route(method, path, query, environ)
        except _HttpError as exc:
            response = self._error(exc.status, exc.message)
        except RunNotFound:
            response = self._error(HTTPStatus.NOT_FOUND, "no such run in this journal")
        except (JournalError, CorruptionError, CompatibilityError) as exc:
            response = self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"the journal could not be read: {exc}")
        headers = [("Content-Type", response.content_type), *_SECURITY_HEADERS, *response.headers]
        headers.append(("Content-Length", str(len(response.body))))
        start_response(f"{response.status.value} {response.status.phrase}", headers)
        return [response.body]

    def _route(
        self, method: str, path: str, query: Mapping[str, list[str]], environ: Mapping[str, Any]
    ) -> _Response:
        parts = [part for part in path.split("/") if part]
        if method == "POST":
            if len(parts) == 3 and parts[0] == "runs" and parts[2] in ("cancel", "signal"):
                return self._post(parts[2], self._run_id(parts[1]), environ)
            raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "only the write actions accept POST")
        if method not in ("GET", "HEAD"):
            raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} is not allowed")
        if not parts:
            return _Response(b"", status=HTTPStatus.SEE_OTHER, headers=[("Location", "/runs")])
        if parts == ["static", "console.css"]:
            return _Response(CSS, content_type="text/css; charset=utf-8")
        if parts == ["static", "console.js"]:
            return _Response(JS, content_type="text/javascript; charset=utf-8")
        if parts == ["runs"]:
            return self._runs(query)
        if parts == ["workers"]:
            return self._workers(query)
        if parts == ["metrics"]:
            return self._metrics()
        if len(parts) >= 2 and parts[0] == "runs":
            run_id = self._run_id(parts[1])
            if len(parts) == 2:
                return self._run(run_id, _one(query, "notice"))
            if parts[2:] == ["history"]:
                return self._history(run_id, query)
            if parts[2:] == ["state.json"]:
                return self._state_json(run_id)
            if parts[2:] == ["graph.svg"]:
                inspection, state = self._inspect(run_id)
                svg = render_graph(
                    state.spec.nodes, state.spec.edges, inspection.nodes, _child_runs(inspection)
                )
                return _Response(svg, content_type="image/svg+xml")
        raise _HttpError(HTTPStatus.NOT_FOUND, "no such page")

    def _check_host(self, host: str) -> None:
        if host.startswith("["):  # [::1]:8080
            name = host[1:].partition("]")[0]
        elif host.count(":") == 1:  # 127.0.0.1:8080, localhost:8080
            name = host.partition(":")[0]
        else:  # a name or an address without a port
            name = host
        name = name.lower()
        if name == "localhost" or name in self._allowed_hosts:
            return
        try:
            ipaddress.ip_address(name)
        except ValueError:
            raise _HttpError(
                HTTPStatus.BAD_REQUEST,
                "this console answers only requests for its IP address or localhost "
                "(start it with --allow-host NAME to serve a name)",
            ) from None

    @staticmethod
    def _run_id(text: str) -> str:
        try:
            return parse_run_id(text)
        except InvalidIdentifier:
            raise _HttpError(HTTPStatus.NOT_FOUND, "not a run id") from None

    # -- pages ------------------------------------------------------------------------

    def _page(self, title: str, body: str, *, refresh: str | None = None, sequence: int = 0) -> _Response:
        live = f' data-refresh="{escape(refresh)}" data-sequence="{sequence}"' if refresh else ""
        html = (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)} · mayfly</title>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="stylesheet" href="/static/console.css"></head>'
            f"<body{live}>"
            '<header class="top"><a class="brand" href="/runs">mayfly</a>'
            '<a href="/runs">Runs</a><a href="/workers">Workers &amp; queues</a>'
            f'<span class="muted mono">{escape(redact_url(self._journal.url))}</span></header>'
            f"<main>{body}</main>"
            '<script src="/static/console.js"></script></body></html>'
        )
        return _Response(html)

    def _error(self, status: HTTPStatus, message: str) -> _Response:
        body = f'<h1>{status.value} {escape(status.phrase)}</h1><p class="error">{escape(message)}</p>'
        response = self._page(status.phrase, body)
        response.status = status
        return response

    def _runs(self, query: Mapping[str, list[str]]) -> _Response:
        state = _one(query, "state") or None
        workflow = _one(query, "workflow") or None
        queue = _one(query, "queue") or None
        cursor = _one(query, "cursor") or None
        size_text = _one(query, "limit")
        size = int(size_text) if size_text.isdigit() and 1 <= int(size_text) <= _MAX_PAGE else self._page_size
        if state is not None and state not in RUN_STATES:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"state must be one of {', '.join(RUN_STATES)}")
        if queue is not None and QUEUE_NAME.fullmatch(queue) is None:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"a queue name must match {QUEUE_NAME.pattern}")
        if workflow is not None and len(workflow) > 256:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "workflow ids are at most 256 characters")
        try:
            page: RunPage = list_page(
                self._journal,
                self._upcasters,
                state=state,
                workflow=workflow,
                queue=queue,
                cursor=cursor,
                limit=size,
            )
        except BadCursor as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        options = "".join(
            f'<option value="{escape(s)}"{" selected" if s == state else ""}>{escape(s)}</option>'
            for s in RUN_STATES
        )
        body = [
            "<h1>Runs</h1>",
            '<form class="filters" method="get" action="/runs">'
            f'<label>state<select name="state"><option value="">any</option>{options}</select></label>'
            f'<label>workflow<input name="workflow" value="{escape(workflow or "")}" placeholder="id">'
            "</label>"
            f'<label>queue<input name="queue" value="{escape(queue or "")}" placeholder="queue"></label>'
            '<button type="submit">Filter</button></form>',
            f'<p class="muted">Listed {escape(page.ordering)}; {page.scanned} runs read for this page.</p>',
        ]
        if not page.rows:
            body.append('<p class="empty">No runs match.</p>')
        else:
            body.append(
                '<table class="runs"><thead><tr><th>Run</th><th>Workflow</th><th>Status</th><th>Queue</th>'
                "<th>Nodes</th><th>Waiting on</th><th>Parent</th><th>Updated</th></tr></thead><tbody>"
            )
            for row in page.rows:
                body.append(
                    f'<tr data-run="{escape(row.run_id)}" data-status="{escape(row.status)}">'
                    f"<td>{_run_link(row.run_id)}</td><td>{escape(row.workflow)}</td>"
                    f"<td>{_badge(row.status)}</td><td>{escape(row.queue)}</td>"
                    f"<td>{row.nodes_done}/{row.nodes}</td><td>{escape(', '.join(row.waiting_on))}</td>"
                    f"<td>{_run_link(row.parent) if row.parent else ''}</td>"
                    f'<td class="muted">{escape(row.updated or row.error)}</td></tr>'
                )
            body.append("</tbody></table>")
        filters = {k: v for k, v in (("state", state), ("workflow", workflow), ("queue", queue)) if v}
        if size != self._page_size:
            filters["limit"] = str(size)
        pager = ['<nav class="pager">']
        if cursor:
            pager.append(f'<a class="first" href="/runs?{escape(urlencode(filters))}">First page</a>')
        if page.next_cursor is not None:
            more = urlencode({**filters, "cursor": page.next_cursor})
            pager.append(f'<a class="next" rel="next" href="/runs?{escape(more)}">Next page</a>')
        pager.append("</nav>")
        body.extend(pager)
        return self._page("Runs", "".join(body))

    def _inspect(self, run_id: str) -> tuple[RunInspection, RunState]:
        recovered = inspect_run(self._journal, run_id, upcasters=self._upcasters)
        # Attempt numbers and times come from the records: the last SCANNED_EVENTS of a long history.
        last = recovered.state.sequence
        after = max(last - SCANNED_EVENTS, 0)
        inspection = build_inspection(
            recovered,
            self._journal.read(run_id, after=after, limit=last - after),
            20,
            journal_url=self._journal.url,
            upcasters=self._upcasters,
            children=journal_children(self._journal, self._upcasters),
        )
        return inspection, recovered.state

    def _run(self, run_id: str, notice: str) -> _Response:
        inspection, state = self._inspect(run_id)
        epoch = inspection.epoch_ms
        terminal = inspection.result is not None
        facts = [
            ("Workflow", escape(f"{inspection.workflow_id}@{inspection.workflow_version}")),
            ("Status", _badge(inspection.status)),
            ("Queue", escape(state.queue)),
            ("Started", escape(_utc(epoch)) if epoch is not None else "unknown (recorded before epochs)"),
            ("Run time", escape(_duration(inspection.now))),
            ("Events", f'{inspection.sequence} (<a href="/runs/{quote(run_id)}/history">timeline</a>)'),
        ]
        if inspection.sequence > SCANNED_EVENTS:
            facts.append(
                ("Attempt times", f"from the last {SCANNED_EVENTS} events (older attempts show none)")
            )
        if inspection.parent_run_id is not None:
            parent = _run_link(inspection.parent_run_id)
            facts.append(("Parent", f"{parent} node {escape(inspection.parent_node_id or '')}"))
        budgets = inspection.budgets
        facts.append(
            (
                "Budgets",
                escape(
                    f"attempts {budgets.attempts_used}/{budgets.attempts_limit}, "
                    f"transitions {budgets.transitions_used}/{budgets.transitions_limit}"
                    + (
                        f", elapsed limit {_duration(budgets.elapsed_limit_ms)}"
                        if budgets.elapsed_limit_ms
                        else ""
                    )
                    + (f"; exhausted: {budgets.exhausted.kind}" if budgets.exhausted else "")
                ),
            )
        )
        if inspection.cancellation is not None:
            c = inspection.cancellation
            facts.append(("Cancelled", escape(f"by {c.requester} at {_wall(epoch, c.at)}: {c.reason}")))
        body = [f'<h1>Run <span class="mono">{escape(run_id)}</span></h1>']
        if notice in _NOTICES:
            body.append(f'<p class="notice">{escape(_NOTICES[notice])}</p>')
        body.append('<dl class="facts">')
        body.extend(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
        body.append("</dl>")
        body.append("<h2>Graph</h2>")
        graph = render_graph(state.spec.nodes, state.spec.edges, inspection.nodes, _child_runs(inspection))
        body.append(f'<div class="graph-box">{graph}</div>')
        body.append(_legend())
        body.append(
            '<h2>Nodes</h2><table class="nodes"><thead><tr><th>Node</th><th>Handler</th><th>Status</th>'
            "<th>Attempt</th><th>Outcome</th><th>Reason</th><th>Deadline</th><th>Child run</th></tr></thead>"
            "<tbody>"
        )
        child_runs = _child_runs(inspection)
        for node in inspection.nodes:
            outcome = (
                "" if node.outcome is None else node.outcome.value + (" (timeout)" if node.timeout else "")
            )
            reason = (
                node.reason or node.failure_detail or ("" if node.failure is None else node.failure.value)
            )
            deadline = node.attempt_deadline if node.attempt_deadline is not None else node.retry_deadline
            kind = (
                "attempt" if node.attempt_deadline is not None else "retry at" if deadline is not None else ""
            )
            body.append(
                f'<tr data-node="{escape(node.node_id)}" data-state="{escape(node.status.value)}">'
                f"<td>{escape(node.node_id)}</td><td class=mono>{escape(node.handler)}</td>"
                f"<td>{_badge(node.status.value)}</td><td>{node.attempt} ({node.total_attempts} in all)</td>"
                f"<td>{escape(outcome)}</td><td>{escape(reason)}</td>"
                f"<td>{escape(f'{kind} {_wall(epoch, deadline)}'.strip())}</td>"
                f"<td>{_run_link(child_runs[node.node_id]) if node.node_id in child_runs else ''}</td></tr>"
            )
        body.append("</tbody></table>")
        waits = [node for node in inspection.nodes if node.waiting_for is not None]
        body.append("<h2>Waits</h2>")
        if waits:
            body.append(
                '<table class="waits"><thead><tr><th>Node</th><th>Signal</th><th>Expires</th></tr></thead>'
                "<tbody>"
            )
            for node in waits:
                expires = "no deadline" if node.wait_deadline is None else _wall(epoch, node.wait_deadline)
                body.append(
                    f'<tr data-node="{escape(node.node_id)}"><td>{escape(node.node_id)}</td>'
                    f"<td>{escape(node.waiting_for or '')}</td><td>{escape(expires)}</td></tr>"
                )
            body.append("</tbody></table>")
        else:
            body.append('<p class="muted">No node waits for a signal.</p>')
        if inspection.blocking:
            body.append('<h2>Why nodes are not progressing</h2><ul class="blocking">')
            body.extend(
                f'<li data-node="{escape(b.node_id)}"><b>{escape(b.node_id)}</b>: {escape(b.detail)}</li>'
                for b in inspection.blocking
            )
            body.append("</ul>")
        body.append(
            '<h2>Attempts</h2><table class="attempts"><thead><tr><th>Attempt</th><th>Node</th><th>#</th>'
            "<th>Outcome</th><th>Reason</th><th>Started</th><th>Wall time</th><th>Child run</th></tr></thead>"
            "<tbody>"
        )
        for a in inspection.attempts:
            outcome = (
                "in flight" if a.outcome is None else a.outcome.value + (" (timeout)" if a.timeout else "")
            )
            took = (
                _duration(a.finished_at - a.started_at)
                if a.finished_at is not None and a.started_at is not None
                else ""
            )
            body.append(
                f'<tr data-attempt="{escape(a.attempt_id)}"><td class=mono>{escape(a.attempt_id[-12:])}</td>'
                f"<td>{escape(a.node_id)}</td><td>{'' if a.attempt is None else a.attempt}</td>"
                f"<td>{escape(outcome)}</td><td>{escape(a.reason)}</td>"
                f"<td>{escape(_wall(epoch, a.started_at))}</td><td>{escape(took)}</td>"
                f"<td>{_run_link(a.child_run_id) if a.child_run_id else ''}</td></tr>"
            )
        body.append("</tbody></table>")
        children = sorted({a.child_run_id for a in inspection.attempts if a.child_run_id})
        if children:
            body.append('<h2>Child runs</h2><ul class="children">')
            body.extend(f"<li>{_run_link(child)}</li>" for child in children)
            body.append("</ul>")
        body.append(
            f'<h2>Recent history</h2><p><a href="/runs/{quote(run_id)}/history">The whole timeline</a> '
            f'({inspection.history.complete} events)</p><ol class="history recent">'
        )
        body.extend(f"<li class=mono>{escape(line)}</li>" for line in inspection.history.lines)
        body.append("</ol>")
        if self.writes_enabled and not terminal:
            body.append(self._action_forms(run_id, [node.node_id for node in waits]))
        return self._page(
            f"Run {run_id}",
            "".join(body),
            refresh=None if terminal else f"/runs/{quote(run_id)}/state.json",
            sequence=inspection.sequence,
        )

    def _history(self, run_id: str, query: Mapping[str, list[str]]) -> _Response:
        after_text = _one(query, "after")
        if after_text and not after_text.isdigit():
            raise _HttpError(HTTPStatus.BAD_REQUEST, "after must be a sequence number")
        page: HistoryPage = history_page(self._journal, run_id, self._upcasters, after=int(after_text or 0))
        body = [
            f"<h1>Timeline of run {_run_link(run_id)}</h1>",
            f'<p class="muted">Events {page.after + 1}-'
            f"{page.lines[-1].sequence if page.lines else page.after}"
            f" of {page.last_sequence}.</p>",
            '<table class="history"><thead><tr><th>#</th><th>Event</th><th>Node</th><th>What happened</th>'
            "</tr></thead><tbody>",
        ]
        body.extend(
            f'<tr data-sequence="{line.sequence}"><td>{line.sequence}</td>'
            f"<td class=mono>{escape(line.event_type)}"
            f"</td><td>{escape(line.subject)}</td><td>{escape(line.text)}</td></tr>"
            for line in page.lines
        )
        body.append('</tbody></table><nav class="pager">')
        if page.after > 0:
            body.append(f'<a class="first" href="/runs/{quote(run_id)}/history">First events</a>')
        if page.next_after is not None:
            body.append(
                f'<a class="next" rel="next" href="/runs/{quote(run_id)}/history?after={page.next_after}">'
                "Next events</a>"
            )
        body.append("</nav>")
        return self._page(f"Timeline {run_id}", "".join(body))

    def _state_json(self, run_id: str) -> _Response:
        recovered = inspect_run(self._journal, run_id, upcasters=self._upcasters)
        inspection = build_inspection(
            recovered,
            None,
            0,
            upcasters=self._upcasters,
            children=journal_children(self._journal, self._upcasters),
        )
        doc = {
            "run_id": run_id,
            "status": inspection.status,
            "terminal": inspection.result is not None,
            "sequence": inspection.sequence,
            "nodes": {node.node_id: node.status.value for node in inspection.nodes},
        }
        return _Response(msgspec.json.encode(doc), content_type="application/json")

    def _lease_store(self) -> RecoveryLeaseStore | str:
        """The journal's lease store, opened on first use (it only reads: the console holds no lease).

        Where it cannot be opened (an LMDB environment opened ``readonly=true``
        serves no leases), why, which the workers page says instead.
        """
        if self._leases is None:
            try:
                self._leases = self._plugins.open_leases(self._url)
            except MayflyError as exc:
                return f"{type(exc).__name__}: {exc}"
        return self._leases

    def _workers(self, query: Mapping[str, list[str]]) -> _Response:
        after = _one(query, "after") or None
        if after is not None:
            try:
                after = parse_run_id(after)
            except InvalidIdentifier:
                raise _HttpError(HTTPStatus.BAD_REQUEST, "after must be a run id") from None
        view: WorkersView = workers_view(self._journal)
        leases = self._lease_store()
        if isinstance(leases, str):
            leases_html = (
                '<h2 id="leases">Leases</h2><p class="error">The lease store could not be opened, so who '
                f"owns which run cannot be shown: {escape(leases)}</p>"
            )
        else:
            leases_html = self._leases_section(lease_page(leases, after=after))
        body = ["<h1>Workers and queues</h1>", leases_html]
        if not view.index:
            body.append(
                '<p class="error">This journal keeps no run index, so no worker claims from it: '
                "runs are driven by the process that started them.</p>"
            )
        body.append(
            '<h2>Queues</h2><table class="queues"><thead><tr><th>Queue</th><th>Concurrency</th>'
            "<th>Per worker</th><th>Rate</th><th>Order</th><th>In progress</th><th>Starts in window</th>"
            "<th>New</th><th>Running</th><th>Waiting</th><th>Due now</th><th>Ended</th></tr></thead><tbody>"
        )
        for row in view.queues:
            s = row.settings

            def cell(value: object) -> str:
                return "-" if value is None else escape(str(value))

            counts = row.by_status
            limited = row.usage is not None and s is not None and s.rate_limit is not None
            starts = row.usage.recent_starts if limited and row.usage is not None else None
            body.append(
                f'<tr data-queue="{escape(row.name)}"><td>{escape(row.name)}</td>'
                f"<td>{cell(None if s is None else s.concurrency)}</td>"
                f"<td>{cell(None if s is None else s.worker_concurrency)}</td>"
                f"<td>{cell(None if s is None else s.rate)}</td>"
                f"<td>{'priority' if s is not None and s.priority else 'fifo'}</td>"
                f"<td>{cell(None if row.usage is None else row.usage.in_progress)}</td>"
                f"<td>{cell(starts)}</td>"
                f'<td data-count="new">{counts.get("new", 0)}</td>'
                f'<td data-count="running">{counts.get("running", 0)}</td>'
                f'<td data-count="waiting">{counts.get("waiting", 0)}</td>'
                f'<td data-count="due">{row.due}</td>'
                f'<td data-count="terminal">{counts.get("terminal", 0)}</td></tr>'
            )
        body.append("</tbody></table>")
        if not view.complete:
            body.append(f'<p class="muted">Counted over the first {view.scanned} runs of the journal.</p>')
        if not view.queue_control:
            body.append('<p class="muted">This journal keeps no queue limits (no queue_control).</p>')
        body.append(
            '<h2>Runs claimed by workers</h2><p class="muted">Root runs a worker has claimed and that have '
            "not ended. A run a worker is driving holds its recovery lease: its owner is listed under "
            '<a href="#leases">Leases</a>.</p>'
        )
        if view.in_progress:
            body.append(
                '<table class="claimed"><thead><tr><th>Run</th><th>Queue</th><th>Index status</th>'
                "<th>First claimed</th><th>Next wake</th><th>Wake asked</th></tr></thead><tbody>"
            )
            for run in view.in_progress:
                body.append(
                    f'<tr data-run="{escape(run.run_id)}"><td>{_run_link(run.run_id)}</td>'
                    f"<td>{escape(run.queue)}</td><td>{escape(run.status)}</td>"
                    f"<td>{escape(_utc(run.started_ms))}</td>"
                    f"<td>{escape(_utc(run.ready_at_ms) if run.status == 'waiting' else '')}</td>"
                    f"<td>{'yes' if run.wake else ''}</td></tr>"
                )
            body.append("</tbody></table>")
        else:
            body.append('<p class="muted">None.</p>')
        body.append(f'<p class="muted">As of {escape(_utc(view.now_ms))}.</p>')
        return self._page("Workers and queues", "".join(body))

    def _leases_section(self, page: LeasePage) -> str:
        """Who owns which run: each live lease's run, owner, fencing token and time to expiry."""
        parts = ['<h2 id="leases">Leases</h2>']
        if not page.listed:
            parts.append(
                '<p class="muted">This lease store does not list its leases (it declares no '
                "lease_listing), so who owns which run cannot be shown.</p>"
            )
            return "".join(parts)
        parts.append(
            '<p class="muted">The live recovery leases, by run id: the owner is the id of the worker or '
            "process driving the run, and each append it makes carries the token. A lease ends when its "
            "holder releases it, when its holder's process ends, or when it is not renewed in time.</p>"
        )
        if not page.leases:
            parts.append('<p class="muted leases-none">No run is leased now.</p>')
        else:
            parts.append(
                '<table class="leases"><thead><tr><th>Run</th><th>Owner</th><th>Token</th>'
                "<th>Expires in</th><th>Expires at</th></tr></thead><tbody>"
            )
            for lease in page.leases:
                if lease.expires_in_ms is None:
                    expires_in, expires_at = "held until released or its process ends", ""
                else:
                    expires_in = _duration(max(0, lease.expires_in_ms)) + " unless renewed"
                    expires_at = _utc(lease.expires_at_ms)
                left = "" if lease.expires_in_ms is None else str(lease.expires_in_ms)
                parts.append(
                    f'<tr data-lease="{escape(lease.run_id)}" data-owner="{escape(lease.owner)}" '
                    f'data-token="{lease.fencing_token}" data-expires-in-ms="{left}">'
                    f"<td>{_run_link(lease.run_id)}</td><td class=mono>{escape(lease.owner)}</td>"
                    f"<td>{lease.fencing_token}</td><td>{escape(expires_in)}</td>"
                    f"<td>{escape(expires_at)}</td></tr>"
                )
            parts.append("</tbody></table>")
        pager = ['<nav class="pager">']
        if page.after is not None:
            pager.append('<a class="first" href="/workers#leases">First leases</a>')
        if page.next_after is not None:
            more = escape(urlencode({"after": page.next_after}))
            pager.append(f'<a class="next" rel="next" href="/workers?{more}#leases">Next leases</a>')
        pager.append("</nav>")
        parts.extend(pager)
        return "".join(parts)

    def _metrics(self) -> _Response:
        return _Response(prometheus.render(self._journal), content_type=prometheus.CONTENT_TYPE)

    # -- write actions ----------------------------------------------------------------

    def _action_forms(self, run_id: str, waiting: list[str]) -> str:
        target = quote(run_id)
        token = (
            '<label>console token<input type="password" name="console_token" required '
            'autocomplete="off"></label>'
            '<label><span><input type="checkbox" name="confirm" value="yes" required> I confirm'
            "</span></label>"
        )
        parts = ["<h2>Actions</h2>"]
        if waiting:
            options = "".join(f'<option value="{escape(n)}">{escape(n)}</option>' for n in waiting)
            parts.append(
                f'<form class="action signal" method="post" action="/runs/{target}/signal" '
                f'data-confirm="Deliver this signal to run {escape(run_id)}?">'
                f'<label>node<select name="node">{options}</select></label>'
                '<label>signal token<input type="password" name="token" required autocomplete="off"></label>'
                '<label>decision<input name="decision" required placeholder="approve, reject or JSON" '
                'autocomplete="off"></label>'
                f"{token}<button type=submit>Signal</button></form>"
            )
        parts.append(
            f'<form class="action cancel" method="post" action="/runs/{target}/cancel" '
            f'data-confirm="Cancel run {escape(run_id)}?">'
            '<label>reason<input name="reason" required maxlength="4096"></label>'
            f"{token}<button type=submit>Cancel run</button></form>"
        )
        return "".join(parts)

    def _post(self, action: str, run_id: str, environ: Mapping[str, Any]) -> _Response:
        if self._write_token is None:
            raise _HttpError(HTTPStatus.FORBIDDEN, "write actions are off; start `mayfly ui --allow-writes`")
        host = environ.get("HTTP_HOST", "")
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and origin != f"http://{host}":
            raise _HttpError(HTTPStatus.FORBIDDEN, "cross-origin form posts are refused")
        if environ.get("CONTENT_TYPE", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            raise _HttpError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "post the action's form")
        raw = environ["wsgi.input"].read()
        try:
            form = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
        except (UnicodeDecodeError, ValueError):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "malformed form") from None
        given = _field(form, "console_token").encode()
        if not hmac.compare_digest(given, self._write_token.encode()):
            raise _HttpError(HTTPStatus.FORBIDDEN, "the console token is wrong")
        if _field(form, "confirm") != "yes":
            raise _HttpError(HTTPStatus.BAD_REQUEST, "confirm the action (tick the confirmation box)")
        runtime = self._writer()
        try:
            if action == "cancel":
                reason = _field(form, "reason").strip()
                if not reason:
                    raise _HttpError(HTTPStatus.BAD_REQUEST, "say why the run is cancelled")
                state = runtime.inspect(run_id).state
                if state.status.is_terminal:
                    raise _HttpError(HTTPStatus.CONFLICT, f"run already {state.status.value}")
                cancel_run_cascade(
                    runtime.journal,
                    runtime.leases,
                    run_id,
                    requester="mayfly-ui",
                    reason=reason,
                    owner=f"mayfly-ui:{os.getpid()}",
                    ids=Uuid7IdSource(),
                    upcasters=runtime.upcasters,
                )
                notice = "cancelled"
            else:
                secret = _field(form, "token")
                text = _field(form, "decision").strip()
                decision = _decision(text)
                if isinstance(decision, str):
                    decision = {"decision": decision, "by": "mayfly-ui"}
                try:
                    token = SignalToken(secret)
                except ValueError:
                    raise _HttpError(HTTPStatus.BAD_REQUEST, "the signal token is malformed") from None
                disposition = runtime.signal(run_id, _field(form, "node"), token, decision)
                notice = f"signal-{disposition.status}"
        except LeaseHeld:
            raise _HttpError(
                HTTPStatus.CONFLICT, "another process owns the run (its recovery lease is held); retry later"
            ) from None
        except CommandRejected as exc:
            code = getattr(exc.rejection, "code", None)
            raise _HttpError(HTTPStatus.CONFLICT, f"refused: {getattr(code, 'value', 'rejected')}") from None
        except MayflyError as exc:
            raise _HttpError(HTTPStatus.CONFLICT, f"refused: {type(exc).__name__}") from None
        location = f"/runs/{quote(run_id)}?{urlencode({'notice': notice})}"
        return _Response(b"", status=HTTPStatus.SEE_OTHER, headers=[("Location", location)])

    def _writer(self) -> WorkflowRuntime:
        if self._runtime is None:
            self._runtime = WorkflowRuntime(self._url, HandlerRegistry(), plugins=self._plugins)
        return self._runtime


def _child_runs(inspection: RunInspection) -> dict[str, str]:
    """Each calling node's latest child run (attempts are in order)."""
    found = {node.node_id: node.child_run_id for node in inspection.nodes if node.child_run_id}
    for attempt in inspection.attempts:
        if attempt.child_run_id is not None:
            found[attempt.node_id] = attempt.child_run_id
    return found


def _decision(text: str) -> Any:
    if not text:
        raise _HttpError(HTTPStatus.BAD_REQUEST, "give a decision: a word such as approve, or JSON")
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        if text.replace("-", "").replace("_", "").isalnum():
            return text
    raise _HttpError(HTTPStatus.BAD_REQUEST, "the decision is neither a word nor JSON")


def _one(query: Mapping[str, list[str]], name: str) -> str:
    values = query.get(name)
    return values[0][:1024] if values else ""
