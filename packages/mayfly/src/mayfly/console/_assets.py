"""The console's only assets, served from the process itself (never from a CDN)."""

from __future__ import annotations

from typing import Final

from mayfly.console._graph import STATE_COLOURS

__all__ = ["CSS", "JS"]

_BASE: Final = b"""\
:root { --ink: #212121; --muted: #616161; --line: #e0e0e0; --accent: #3949ab; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); }
header.top { background: #1a237e; color: #fff; padding: 10px 24px; display: flex; gap: 24px;
  align-items: baseline; }
header.top a { color: #fff; text-decoration: none; }
header.top .brand { font-weight: 700; font-size: 17px; }
main { padding: 16px 24px 40px; }
h1 { font-size: 20px; margin: 4px 0 12px; }
h2 { font-size: 16px; margin: 22px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; font-size: 12px; text-transform: uppercase; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
a { color: var(--accent); }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; border: 1px solid; font-size: 12px; }
.muted { color: var(--muted); }
.notice { background: #e8f5e9; border: 1px solid #a5d6a7; padding: 8px 12px; margin: 8px 0; }
.error { background: #ffebee; border: 1px solid #ef9a9a; padding: 8px 12px; margin: 8px 0; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0 0 8px; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; }
.graph-box { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; padding: 8px; }
svg.graph { font: 13px system-ui, sans-serif; }
svg.graph .edge-label { font-size: 11px; fill: var(--muted); paint-order: stroke; stroke: #fff;
  stroke-width: 3px; }
svg.graph .edge-label.correction { fill: #8e24aa; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 8px 0; }
ul.legend li { display: flex; align-items: center; gap: 5px; font-size: 12px; }
ul.legend .swatch { width: 14px; height: 14px; border: 2px solid; border-radius: 3px; display: inline-block; }
form.filters { display: flex; gap: 10px; align-items: end; flex-wrap: wrap; margin-bottom: 12px; }
form.filters label, form.action label { display: flex; flex-direction: column; font-size: 12px;
  color: var(--muted); }
form.action { border: 1px solid var(--line); padding: 10px; margin: 8px 0; display: flex; gap: 10px;
  flex-wrap: wrap; align-items: end; }
.pager { margin: 10px 0; display: flex; gap: 16px; }
ul.legend .swatch.child { border-style: double; border-width: 4px; border-color: #616161; }
.st-unknown { background: #ffffff; border-color: #000000; color: #000000; }
"""

CSS: Final = (
    _BASE
    + "".join(
        f".st-{name} {{ background: {c.fill}; border-color: {c.stroke}; color: {c.text}; }}\n"
        for name, c in STATE_COLOURS.items()
    ).encode()
)
"""The console's stylesheet: the layout, and one class per node state in :data:`STATE_COLOURS`."""

JS: Final = b"""\
// Live refresh: while the run is in progress, poll its state and reload when it changed.
(function () {
  var body = document.body;
  var url = body.getAttribute("data-refresh");
  if (!url) { return; }
  var seen = body.getAttribute("data-sequence");
  var every = 2000;
  function poll() {
    fetch(url, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (s) {
      if (String(s.sequence) !== seen) { window.location.reload(); return; }
      if (!s.terminal) { window.setTimeout(poll, every); }
    }).catch(function () { window.setTimeout(poll, every * 2); });
  }
  window.setTimeout(poll, every);
  var forms = document.querySelectorAll("form[data-confirm]");
  for (var i = 0; i < forms.length; i++) {
    forms[i].addEventListener("submit", function (e) {
      if (!window.confirm(this.getAttribute("data-confirm"))) { e.preventDefault(); }
    });
  }
})();
"""
