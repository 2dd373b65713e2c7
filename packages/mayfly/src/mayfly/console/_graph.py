"""A run's graph as server-side SVG: a layered layout of the specification, coloured by node state.

Nodes are placed in layers, left to right, by the longest path over the
``depends_on`` and conditional edges that go forward; an edge that closes a
cycle (a correction loop such as ``review -> implement`` on changes
requested) is drawn as an arc over the nodes in the correction colour, so
loops stay visible. A node that calls a child run has a double border and,
once the child exists, links to the child run's page. Every node carries
``data-node`` and ``data-state`` attributes and its fill is the state's
colour in :data:`STATE_COLOURS` (the legend shows them all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Final, NamedTuple
from urllib.parse import quote

from mayfly.inspect import NodeSummary
from mayfly.model.spec import Edge, Node, OnField, OnOutcome
from mayfly.model.state import NodeStatus

__all__ = ["STATE_COLOURS", "StateColour", "render_graph"]


class StateColour(NamedTuple):
    """The fill, stroke and text colours of one node state."""

    fill: str
    stroke: str
    text: str


STATE_COLOURS: Final[Mapping[str, StateColour]] = {
    "pending": StateColour("#eeeeee", "#9e9e9e", "#424242"),
    "ready": StateColour("#e3f2fd", "#42a5f5", "#0d47a1"),
    "running": StateColour("#bbdefb", "#1e88e5", "#0d47a1"),
    "waiting": StateColour("#fff8e1", "#ffb300", "#6d4c00"),
    "retry_pending": StateColour("#ffe0b2", "#fb8c00", "#6d3a00"),
    "changes_requested": StateColour("#f3e5f5", "#8e24aa", "#4a148c"),
    "succeeded": StateColour("#c8e6c9", "#43a047", "#1b5e20"),
    "failed": StateColour("#ffcdd2", "#e53935", "#b71c1c"),
    "blocked": StateColour("#d7ccc8", "#6d4c41", "#3e2723"),
    "cancelled": StateColour("#cfd8dc", "#546e7a", "#263238"),
    "skipped": StateColour("#fafafa", "#bdbdbd", "#757575"),
}
"""Each node state's colours (the same palette as ``mayfly inspect --mermaid``)."""

_UNKNOWN: Final = StateColour("#ffffff", "#000000", "#000000")
_CORRECTION: Final = "#8e24aa"
_NODE_W: Final = 124
_NODE_H: Final = 52
_GAP_X: Final = 68
_GAP_Y: Final = 28
_MARGIN: Final = 20
_ARC: Final = 30  # height of one correction arc above the nodes


def colour_of(state: str) -> StateColour:
    """The colours of ``state`` (a state added later is drawn black on white)."""
    return STATE_COLOURS.get(state, _UNKNOWN)


def _predicate(edge: Edge) -> str:
    when = edge.when
    if isinstance(when, OnOutcome):
        label = when.outcome.value
    elif isinstance(when, OnField):
        label = f"{when.field} = …"  # the compared value is spec data, but may mirror outputs: not shown
    else:
        label = "any outcome"
    return label if edge.exclusive is None else f"{label} [{edge.exclusive}]"


def _back_edges(nodes: Sequence[Node], links: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
    """The links that close a cycle in a depth-first walk from the nodes in specification order."""
    out: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for source, target in links:
        out[source].append(target)
    colour = [0] * len(nodes)  # 0 unseen, 1 on the walk, 2 done
    back: set[tuple[int, int]] = set()
    for root in range(len(nodes)):
        if colour[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        colour[root] = 1
        while stack:
            node, index = stack[-1]
            if index < len(out[node]):
                stack[-1] = (node, index + 1)
                target = out[node][index]
                if colour[target] == 1:
                    back.add((node, target))
                elif colour[target] == 0:
                    colour[target] = 1
                    stack.append((target, 0))
            else:
                colour[node] = 2
                stack.pop()
    return back


def _layers(count: int, forward: Sequence[tuple[int, int]]) -> list[int]:
    layer = [0] * count
    incoming = [0] * count
    out: dict[int, list[int]] = {i: [] for i in range(count)}
    for source, target in forward:
        out[source].append(target)
        incoming[target] += 1
    ready = [i for i in range(count) if incoming[i] == 0]
    while ready:
        node = ready.pop(0)
        for target in out[node]:
            layer[target] = max(layer[target], layer[node] + 1)
            incoming[target] -= 1
            if incoming[target] == 0:
                ready.append(target)
    return layer


def _label(text: str, limit: int = 22) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_graph(
    nodes: Sequence[Node],
    edges: Sequence[Edge],
    summaries: Sequence[NodeSummary],
    child_runs: Mapping[str, str] | None = None,
) -> str:
    """The SVG of a run's graph: ``nodes`` and ``edges`` of its specification, states from ``summaries``.

    ``child_runs`` maps a calling node to its latest child run (a node's own
    ``child_run_id`` is only set while the call is in flight).
    """
    child_runs = child_runs or {}
    position = {node.id: i for i, node in enumerate(nodes)}
    summary = {s.node_id: s for s in summaries}
    links: list[tuple[int, int, str, str]] = []  # source, target, kind, label
    for i, node in enumerate(nodes):
        for prereq in node.depends_on:
            if prereq in position:
                links.append((position[prereq], i, "dependency", ""))
    for edge in edges:
        if edge.source in position and edge.target in position:
            links.append((position[edge.source], position[edge.target], "conditional", _predicate(edge)))
    back = _back_edges(nodes, [(s, t) for s, t, _, _ in links])
    forward = [(s, t) for s, t, _, _ in links if (s, t) not in back and s != t]
    layer = _layers(len(nodes), forward)
    rows: dict[int, int] = {}
    slot = [0] * len(nodes)
    for i in range(len(nodes)):
        slot[i] = rows.get(layer[i], 0)
        rows[layer[i]] = slot[i] + 1
    loops = [(s, t, label) for s, t, kind, label in links if (s, t) in back or s == t]
    top = _MARGIN + _ARC * len(loops)
    width = _MARGIN * 2 + (max(layer, default=0) + 1) * (_NODE_W + _GAP_X) - _GAP_X
    height = top + max(rows.values(), default=1) * (_NODE_H + _GAP_Y) - _GAP_Y + _MARGIN

    def box(i: int) -> tuple[int, int]:
        return _MARGIN + layer[i] * (_NODE_W + _GAP_X), top + slot[i] * (_NODE_H + _GAP_Y)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="run graph">',
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#616161"/></marker>'
        f'<marker id="arrow-loop" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{_CORRECTION}"/></marker>'
        "</defs>",
    ]
    for source, target, kind, label in links:
        if (source, target) in back or source == target:
            continue
        sx, sy = box(source)
        tx, ty = box(target)
        x1, y1 = sx + _NODE_W, sy + _NODE_H // 2
        x2, y2 = tx, ty + _NODE_H // 2
        mid = (x1 + x2) // 2
        dash = ' stroke-dasharray="6 4"' if kind == "conditional" else ""
        parts.append(
            f'<path class="edge {kind}" data-from="{escape(nodes[source].id)}" '
            f'data-to="{escape(nodes[target].id)}" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}" '
            f'fill="none" stroke="#616161" stroke-width="1.5"{dash} marker-end="url(#arrow)"/>'
        )
        if label:
            parts.append(
                f'<text class="edge-label" x="{mid}" y="{(y1 + y2) // 2 - 6}" text-anchor="middle">'
                f"{escape(_label(label, 28))}</text>"
            )
    for depth, (source, target, label) in enumerate(loops, start=1):
        sx, sy = box(source)
        tx, ty = box(target)
        x1, x2 = sx + _NODE_W // 2 + 8, tx + _NODE_W // 2 - 8
        peak = top - _ARC * depth + 14
        parts.append(
            f'<path class="edge correction" data-from="{escape(nodes[source].id)}" '
            f'data-to="{escape(nodes[target].id)}" d="M{x1},{sy} C{x1},{peak} {x2},{peak} {x2},{ty}" '
            f'fill="none" stroke="{_CORRECTION}" stroke-width="2" stroke-dasharray="6 4" '
            f'marker-end="url(#arrow-loop)"/>'
        )
        text = f"loop: {label}" if label else "loop"
        parts.append(
            f'<text class="edge-label correction" x="{(x1 + x2) // 2}" y="{peak - 2}" '
            f'text-anchor="middle" fill="{_CORRECTION}">{escape(_label(text, 32))}</text>'
        )
    for i, node in enumerate(nodes):
        found = summary.get(node.id)
        state = found.status.value if found is not None else NodeStatus.PENDING.value
        colours = colour_of(state)
        x, y = box(i)
        child = node.child
        attempts = "" if found is None else f" · {found.total_attempts}"
        title = f"{node.id}: {state}" + ("" if found is None else f", {found.total_attempts} attempts")
        group = (
            f'<g class="node{" child-call" if child is not None else ""}" data-node="{escape(node.id)}" '
            f'data-state="{escape(state)}"><title>{escape(title)}</title>'
            f'<rect x="{x}" y="{y}" width="{_NODE_W}" height="{_NODE_H}" rx="8" fill="{colours.fill}" '
            f'stroke="{colours.stroke}" stroke-width="2"/>'
        )
        if child is not None:
            group += (
                f'<rect x="{x + 4}" y="{y + 4}" width="{_NODE_W - 8}" height="{_NODE_H - 8}" rx="6" '
                f'fill="none" stroke="{colours.stroke}" stroke-width="1"/>'
            )
        group += (
            f'<text x="{x + _NODE_W // 2}" y="{y + 21}" text-anchor="middle" font-weight="bold" '
            f'fill="{colours.text}">{escape(_label(node.id))}</text>'
            f'<text x="{x + _NODE_W // 2}" y="{y + 39}" text-anchor="middle" font-size="11" '
            f'fill="{colours.text}">{escape(_label(state + attempts, 20))}</text></g>'
        )
        child_run = child_runs.get(node.id) or (None if found is None else found.child_run_id)
        if child is not None and child_run is not None:
            group = (
                f'<a class="child-link" href="/runs/{quote(child_run)}" data-child-run="{escape(child_run)}">'
                f"{group}</a>"
            )
        parts.append(group)
    parts.append("</svg>")
    return "".join(parts)
