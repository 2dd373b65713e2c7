"""Exporters: metrics snapshots and PAL facts as JSON lines through the standard library's logging."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import ClassVar, final

import msgspec

from mayfly.hookspecs import PLUGIN_API, hookimpl
from mayfly.telemetry.metrics import MetricsSnapshot
from mayfly.telemetry.pal import PalFact

__all__ = ["JsonLogExporter"]

_ENCODER = msgspec.json.Encoder()


class _MetricsLine(msgspec.Struct, frozen=True):
    event: str
    snapshot: MetricsSnapshot


class _PalLine(msgspec.Struct, frozen=True):
    event: str
    fact: PalFact


@final
class JsonLogExporter:
    """Writes metrics snapshots and PAL facts as JSON lines through :mod:`logging` (stdlib only).

    Each snapshot is one line on the ``mayfly.metrics`` logger (whole, never
    split), each PAL fact one line on ``mayfly.pal``; the message *is* the
    JSON, so a handler with the format ``%(message)s`` writes JSON lines.
    Register an instance as a plugin to receive every published snapshot::

        mayfly.plugins.plugin_manager().register(
            JsonLogExporter(), name="jsonlog", distribution="mayfly-runtime"
        )
    """

    MAYFLY_PLUGIN_API: ClassVar[int] = PLUGIN_API

    def __init__(
        self,
        metrics_logger: logging.Logger | None = None,
        pal_logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
    ) -> None:
        self.metrics_logger = (
            metrics_logger if metrics_logger is not None else logging.getLogger("mayfly.metrics")
        )
        self.pal_logger = pal_logger if pal_logger is not None else logging.getLogger("mayfly.pal")
        self.level = level

    def export_metrics(self, snapshot: MetricsSnapshot) -> None:
        """Log ``snapshot`` as one JSON line ``{"event": "mayfly.metrics", "snapshot": {...}}``."""
        line = _ENCODER.encode(_MetricsLine("mayfly.metrics", snapshot)).decode()
        self.metrics_logger.log(self.level, "%s", line)

    def export_pal(self, facts: Iterable[PalFact]) -> None:
        """Log each fact as one JSON line ``{"event": "mayfly.pal", "fact": {...}}``."""
        for fact in facts:
            self.pal_logger.log(self.level, "%s", _ENCODER.encode(_PalLine("mayfly.pal", fact)).decode())

    @hookimpl
    def mayfly_publish_metrics(self, snapshot: object) -> None:
        """Export a published snapshot (the plugin hook); anything else is ignored."""
        if isinstance(snapshot, MetricsSnapshot):
            self.export_metrics(snapshot)
