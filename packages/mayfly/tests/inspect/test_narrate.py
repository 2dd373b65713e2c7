"""Event narration: one function tells every event, and the CLI timeline and the history both print it."""

from __future__ import annotations

import io
from pathlib import Path

from inspect_runs import REVIEW_REASON, review_spec, run_review

from mayfly.cli._support import Timeline, timeline_line
from mayfly.inspect import build_inspection, history_line, narrate
from mayfly.model.events import NodeOutcomeCommitted, NodeReady, VirtualTimeAdvanced
from mayfly.model.outcomes import ChangesRequested
from mayfly.reducer import decode_event
from mayfly.testing import ReducerHarness


def test_the_timeline_and_the_history_tell_each_event_in_the_same_words(tmp_path: Path) -> None:
    """For every event of a real run, the history line and the timeline entry carry its one narration."""
    run = run_review(tmp_path)
    records = run.records()
    lines = build_inspection(run.recovered(), records).history.lines
    for record, line in zip(records, lines, strict=True):
        event = decode_event(record.event_type, record.schema_version, record.payload)
        told = narrate(event)
        said = told.line if told.subject is not None else told.text  # a run event's type names the run
        assert line == f"#{record.sequence} {record.event_type} {said}"
        entry = timeline_line(event)
        if told.bookkeeping:
            assert entry is None
        else:
            assert entry is not None and " ".join(entry.split()).startswith(told.line)


def test_a_reason_travels_beside_the_narration_and_only_the_timeline_shows_it() -> None:
    """The bounded reason is not in the history line; the timeline appends it on one line."""
    event = NodeOutcomeCommitted(
        "review", ChangesRequested(reason=f"{REVIEW_REASON}\nsecond line"), attempt_id="a1", at=5
    )
    assert history_line(event) == "NodeOutcomeCommitted review changes_requested"
    assert timeline_line(event) == f"review     changes_requested: {REVIEW_REASON} second line"


def test_the_timeline_prints_narrations_and_leaves_out_bookkeeping() -> None:
    """The live timeline writes one entry per narrated event and none for time advancing."""
    out = io.StringIO()
    timeline = Timeline(out, verbose=True, progress=False)
    state = ReducerHarness(review_spec()).state
    timeline(state, (NodeReady("plan", "initial"), VirtualTimeAdvanced(to=10)))
    (entry,) = out.getvalue().splitlines()
    assert entry.endswith("plan       ready (initial)")
