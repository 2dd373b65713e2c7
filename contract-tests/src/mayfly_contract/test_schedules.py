"""Contract clauses of stored schedules (feature ``schedule_store``, :mod:`mayfly.schedules`).

A journal that declares ``schedule_store`` keeps :class:`~mayfly.schedules.Schedule`
definitions durably, by name, with a version and a last started tick:

* ``schedules.roundtrip``, ``schedules.list``: what is put is what get and
  list return, whole (the specification and input included); a replace
  bumps the version and keeps the creation time; remove forgets it;
* ``schedules.versions``: a conditional put (create only, or replace one
  version) refuses a mismatch with ``ScheduleConflict`` and changes nothing;
* ``schedules.ticks``: the recorded last tick only moves forward, survives a
  replace and goes with a remove; marking an unknown schedule stores nothing;
* ``schedules.inputs``: bad names and arguments are refused with
  ``InvalidRecord`` and change nothing;
* ``schedules.reopen`` and ``schedules.cross-process.*``: a schedule is seen
  by a journal opened again, and by other processes; processes racing to
  create one name get exactly one version 1.

Every test uses schedules of its own names and removes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.model.errors import InvalidRecord
from mayfly.model.spec import ChildDefinition, Node, WorkflowSpec
from mayfly.plugins import open_journal
from mayfly.schedules import (
    SCHEDULE_STORE,
    Schedule,
    ScheduleConflict,
    ScheduleStore,
    StoredSchedule,
)

pytestmark = pytest.mark.capability("schedule_store")

SPEC = WorkflowSpec(
    workflow_id="contract.scheduled",
    version=3,
    nodes=(Node("fetch", handler="fetch@1"), Node("report", handler="report@2", depends_on=("fetch",))),
    catalog=(ChildDefinition(workflow_id="contract.child", version=1, nodes=(Node("c", handler="c@1"),)),),
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def store(mayfly_journal: WorkflowJournal) -> ScheduleStore:
    """The journal under test through its ``schedule_store`` feature."""
    served = SCHEDULE_STORE.of(mayfly_journal)
    assert served is not None, "schedule_store is declared, so SCHEDULE_STORE.of must serve the journal"
    return served


@pytest.fixture
def name(store: ScheduleStore) -> Iterator[str]:
    """A schedule name of this test alone; the schedule is removed when the test ends."""
    chosen = f"contract.s-{uuid.uuid4().hex[:12]}"
    yield chosen
    store.schedule_remove(chosen)


def _every(name: str, seconds: int = 2, **fields: object) -> Schedule:
    return Schedule(name=name, spec=SPEC, every_ms=seconds * 1000, **fields)  # type: ignore[arg-type]


@pytest.mark.clause("schedules.declared-implemented")
def test_schedule_store_is_served_by_its_protocol(mayfly_journal: WorkflowJournal) -> None:
    """A journal declaring schedule_store implements ScheduleStore."""
    assert isinstance(SCHEDULE_STORE.of(mayfly_journal), ScheduleStore)


@pytest.mark.clause("schedules.roundtrip")
def test_schedules_are_stored_whole_replaced_and_removed(store: ScheduleStore, name: str) -> None:
    """put stores the whole definition at version 1; a replace is version 2 with the same creation time."""
    assert store.schedule_get(name) is None
    first = Schedule(
        name=name,
        spec=SPEC,
        cron="*/5 9-17 * * 1-5",
        input={"region": "eu", "limits": [1, 2.5, None], "deep": {"ok": True}},
        queue="reports",
        catch_up="all",
    )
    stored = store.schedule_put(first, now_ms=1_000_000, expected_version=None)
    assert stored == StoredSchedule(schedule=first, version=1, created_ms=1_000_000, updated_ms=1_000_000)
    got = store.schedule_get(name)
    assert got == stored
    assert (
        got is not None
        and got.schedule.spec == SPEC
        and got.schedule.spec.content_hash() == SPEC.content_hash()
    )
    second = _every(name, 7, offset_ms=3_000, catchup_ms=60_000, catch_up="skip")
    replaced = store.schedule_put(second, now_ms=2_000_000)
    assert replaced == StoredSchedule(schedule=second, version=2, created_ms=1_000_000, updated_ms=2_000_000)
    assert store.schedule_get(name) == replaced
    assert store.schedule_remove(name) is True
    assert store.schedule_get(name) is None
    assert store.schedule_remove(name) is False
    again = store.schedule_put(first, now_ms=3_000_000)
    assert (again.version, again.created_ms) == (1, 3_000_000), "a removed schedule starts over"


@pytest.mark.clause("schedules.list")
def test_schedules_are_listed_by_name(store: ScheduleStore, name: str) -> None:
    """schedule_list returns every stored schedule, ordered by name, as get returns it."""
    others = [f"{name}.b", f"{name}.a"]
    try:
        for each in (name, *others):
            store.schedule_put(_every(each), now_ms=_now_ms())
        listed = store.schedule_list()
        names = [s.name for s in listed]
        assert names == sorted(names), "schedule_list is ordered by name"
        mine = [s for s in listed if s.name.startswith(name)]
        assert [s.name for s in mine] == [name, f"{name}.a", f"{name}.b"]
        assert mine == [store.schedule_get(s.name) for s in mine]
    finally:
        for each in others:
            store.schedule_remove(each)


@pytest.mark.clause("schedules.versions")
def test_conditional_puts_refuse_a_mismatch_and_change_nothing(store: ScheduleStore, name: str) -> None:
    """expected_version=0 creates only; expected_version=N replaces only version N."""
    created = store.schedule_put(_every(name, 2), now_ms=1_000, expected_version=0)
    assert created.version == 1
    with pytest.raises(ScheduleConflict) as refused:
        store.schedule_put(_every(name, 5), now_ms=2_000, expected_version=0)
    assert (refused.value.expected, refused.value.actual) == (0, 1)
    with pytest.raises(ScheduleConflict):
        store.schedule_put(_every(name, 5), now_ms=2_000, expected_version=2)
    assert store.schedule_get(name) == created
    replaced = store.schedule_put(_every(name, 5), now_ms=3_000, expected_version=1)
    assert (replaced.version, replaced.schedule.every_ms) == (2, 5_000)
    store.schedule_remove(name)
    with pytest.raises(ScheduleConflict) as missing:
        store.schedule_put(_every(name, 5), now_ms=4_000, expected_version=2)
    assert missing.value.actual == 0
    assert store.schedule_get(name) is None


@pytest.mark.clause("schedules.ticks")
def test_the_last_tick_only_moves_forward(store: ScheduleStore, name: str) -> None:
    """schedule_mark keeps the later tick; a replace keeps it; a remove forgets it."""
    assert store.schedule_mark(name, 10_000) is False
    assert store.schedule_get(name) is None, "marking an unknown schedule stores nothing"
    store.schedule_put(_every(name), now_ms=1_000)
    got = store.schedule_get(name)
    assert got is not None and got.last_tick_ms is None
    assert store.schedule_mark(name, 10_000) is True
    assert store.schedule_mark(name, 8_000) is True
    got = store.schedule_get(name)
    assert got is not None and got.last_tick_ms == 10_000, "an earlier tick never moves the last tick back"
    store.schedule_put(_every(name, 4), now_ms=2_000)
    got = store.schedule_get(name)
    assert got is not None and (got.version, got.last_tick_ms) == (2, 10_000)
    assert [s.last_tick_ms for s in store.schedule_list() if s.name == name] == [10_000]
    store.schedule_remove(name)
    store.schedule_put(_every(name), now_ms=3_000)
    got = store.schedule_get(name)
    assert got is not None and got.last_tick_ms is None, "a removed schedule's last tick goes with it"


@pytest.mark.clause("schedules.inputs")
def test_bad_names_and_arguments_are_refused_and_change_nothing(store: ScheduleStore, name: str) -> None:
    """Malformed names, non-schedules, bad times and versions raise InvalidRecord; the stored one stays."""
    stored = store.schedule_put(_every(name), now_ms=1_000)
    for bad in ("", "Upper", "a b", "x" * 129, 7, None):
        with pytest.raises(InvalidRecord):
            store.schedule_get(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRecord):
            store.schedule_remove(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRecord):
            store.schedule_mark(bad, 1_000)  # type: ignore[arg-type]
    with pytest.raises(InvalidRecord):
        store.schedule_put({"name": name, "every_ms": 1000}, now_ms=2_000)  # type: ignore[arg-type]
    for bad_time in (-1, 2**60, "now", True):
        with pytest.raises(InvalidRecord):
            store.schedule_put(_every(name, 9), now_ms=bad_time)  # type: ignore[arg-type]
        with pytest.raises(InvalidRecord):
            store.schedule_mark(name, bad_time)  # type: ignore[arg-type]
    for bad_version in (-1, "1", True):
        with pytest.raises(InvalidRecord):
            store.schedule_put(_every(name, 9), now_ms=2_000, expected_version=bad_version)  # type: ignore[arg-type]
    assert store.schedule_get(name) == stored


@pytest.mark.clause("schedules.reopen")
def test_a_schedule_is_seen_by_the_journal_opened_again(mayfly_journal: WorkflowJournal, name: str) -> None:
    """A journal opened again on the same URL (in this process) finds the schedule and its last tick."""
    store = SCHEDULE_STORE.of(mayfly_journal)
    assert store is not None
    stored = store.schedule_put(_every(name), now_ms=1_000)
    store.schedule_mark(name, 4_000)
    reopened = open_journal(mayfly_journal.url)
    try:
        again = SCHEDULE_STORE.of(reopened)
        assert again is not None
        assert again.schedule_get(name) == StoredSchedule(
            schedule=stored.schedule, version=1, created_ms=1_000, updated_ms=1_000, last_tick_ms=4_000
        )
    finally:
        reopened.close()


_CHILD = textwrap.dedent(
    """
    import json, sys
    from mayfly.plugins import open_journal
    from mayfly.schedules import SCHEDULE_STORE, Schedule, ScheduleConflict
    from mayfly.model.spec import Node, WorkflowSpec

    url, name, action = sys.argv[1], sys.argv[2], sys.argv[3]
    journal = open_journal(url)
    store = SCHEDULE_STORE.of(journal)
    if action == "get":
        got = store.schedule_get(name)
        print(json.dumps(None if got is None else [got.version, got.schedule.every_ms, got.last_tick_ms]))
    else:
        spec = WorkflowSpec(workflow_id="contract.race", version=1, nodes=(Node("n", handler="n@1"),))
        sys.stdin.readline()  # start together
        try:
            made = store.schedule_put(
                Schedule(name=name, spec=spec, every_ms=int(action) * 1000), now_ms=1_000, expected_version=0
            )
            print(json.dumps(["created", made.version]))
        except ScheduleConflict as exc:
            print(json.dumps(["refused", exc.actual]))
    journal.close()
    """
)


@pytest.mark.clause("schedules.cross-process.seen")
@pytest.mark.capability("cross_process")
def test_another_process_sees_the_schedule(mayfly_journal: WorkflowJournal, name: str) -> None:
    """A schedule put here is read by another process, with its version and last tick."""
    store = SCHEDULE_STORE.of(mayfly_journal)
    assert store is not None
    store.schedule_put(_every(name, 3), now_ms=1_000)
    store.schedule_put(_every(name, 6), now_ms=2_000)
    store.schedule_mark(name, 12_000)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mayfly_journal.url, name, "get"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout) == [2, 6_000, 12_000]


@pytest.mark.clause("schedules.cross-process.create-race")
@pytest.mark.capability("cross_process")
def test_processes_racing_to_create_a_name_get_one_version(
    mayfly_journal: WorkflowJournal, name: str
) -> None:
    """Four processes create one name with expected_version=0: one creates it, three are refused."""
    store = SCHEDULE_STORE.of(mayfly_journal)
    assert store is not None
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, mayfly_journal.url, name, str(n + 1)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    time.sleep(1.0)  # let them import and open the journal
    results = []
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(kind for kind, _ in results) == ["created", "refused", "refused", "refused"]
    assert all(version == 1 for _, version in results)
    got = store.schedule_get(name)
    winner = next(n for n, (kind, _) in enumerate(results) if kind == "created")
    assert got is not None and (got.version, got.schedule.every_ms) == (1, (winner + 1) * 1000)
