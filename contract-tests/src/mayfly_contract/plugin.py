"""The pytest plugin of the contract suite: options, fixtures, markers and the certification report.

Pointing the suite at a backend, in order of precedence:

1. ``--mayfly-journal URL`` (and ``--mayfly-leases URL``, default: the same);
2. the ini setting ``mayfly_backend = "pkg.module:factory"``, a zero-argument
   callable returning a journal URL or a ``(journal_url, leases_url)`` pair;
3. overriding the ``mayfly_journal_url`` / ``mayfly_leases_url`` fixtures in a
   ``conftest.py``.

Backends are always opened by URL through ``mayfly.plugins`` so the
cross-process clauses can reopen them in child processes.

Markers: ``@pytest.mark.clause("journal.append.cas-conflict")`` gives a test
its stable clause id; ``@pytest.mark.capability("crash_durable")`` skips it
only when the backend declares that capability absent, with a reason naming
the backend and the capability. A capability is a flag of the journal's
``JournalCapabilities``, or of the lease store's own ``LeaseCapabilities``
(``lease_listing``).

Probe runs: every run id the suite creates is recorded, and when the session
ends the runs are purged from the store through the backend's ``run_purge``
feature, so ``mayfly runs`` on that store does not list hundreds of probes
afterwards. A backend that declares no purging keeps them, and the report
says how many (``--mayfly-keep-probe-runs`` keeps them on purpose).
"""

from __future__ import annotations

import importlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import pytest

from mayfly.journal import RUN_PURGE, JournalCapabilities, WorkflowJournal
from mayfly.lease import LeaseCapabilities, RecoveryLeaseStore
from mayfly.model.errors import MayflyError
from mayfly.plugins import open_journal, open_leases, url_scheme
from mayfly_contract.support import Records

_JOURNAL_OPTION = "--mayfly-journal"
_LEASES_OPTION = "--mayfly-leases"
_INI_FACTORY = "mayfly_backend"
_KNOWN_FAILURES = "mayfly_known_failures"
_KEEP_PROBES = "--mayfly-keep-probe-runs"
# What a capability declared absent means for its clauses, where the name alone does not say.
_ABSENT = {
    "network": ": it waits on no socket, so no network wait of it can block the hub (its calls run inline)",
    "run_index": " (feature mayfly.runindex.RUN_INDEX): it keeps no run index, no worker can claim from it",
    "queue_control": " (feature mayfly.queues.QUEUE_CONTROL): it enforces no queue limits or dedup ids",
    "schedule_store": " (feature mayfly.schedules.SCHEDULE_STORE): it stores no schedules; workers serve "
    "only the schedules given in code",
    "lease_listing": " (feature mayfly.lease.LEASE_LISTING): it cannot say who holds which lease",
}
_FLAGS = (
    "cross_process",
    "fencing",
    "crash_durable",
    "fault_injection",
    "snapshots",
    "lease_expiry",
    "run_summaries",
    "run_tails",
    "run_verification",
    "run_purge",
    "network",
    "run_index",
    "run_wakeups",
    "append_wakeups",
    "queue_control",
    "schedule_store",
)


@dataclass
class _Certification:
    """What the report needs: the backend under test and each clause's outcome."""

    journal_url: str | None = None
    journal_type: str = ""
    capabilities: JournalCapabilities | None = None
    lease_capabilities: LeaseCapabilities | None = None
    outcomes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    probes: str = ""


_CERTIFICATION = pytest.StashKey[_Certification]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the backend options and the ini factory setting."""
    group = parser.getgroup("mayfly-contract", "Mayfly backend contract suite")
    group.addoption(
        _JOURNAL_OPTION,
        metavar="URL",
        default=None,
        help="journal URL of the backend to certify, e.g. file:///tmp/j or sqlite:///tmp/j.db",
    )
    group.addoption(
        _LEASES_OPTION,
        metavar="URL",
        default=None,
        help="recovery-lease URL of the backend (default: the journal URL)",
    )
    group.addoption(
        _KEEP_PROBES,
        action="store_true",
        default=False,
        help="leave the suite's probe runs in the store instead of purging them at the end",
    )
    group.addoption(
        "--mayfly-known-failure",
        metavar="CLAUSE",
        action="append",
        default=[],
        help="clause id the backend is known to fail: run it as a strict xfail (repeatable)",
    )
    parser.addini(
        _KNOWN_FAILURES,
        "clause ids the backend is known to fail, one per line (run as strict xfail)",
        type="linelist",
        default=[],
    )
    parser.addini(
        _INI_FACTORY,
        'backend factory "pkg.module:callable" returning a journal URL or (journal, leases) URLs',
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and the report's state."""
    config.addinivalue_line("markers", "clause(id): the stable Mayfly contract clause id this test checks")
    config.addinivalue_line(
        "markers",
        "capability(name): skip only if the backend declares this JournalCapabilities flag false",
    )
    config.stash[_CERTIFICATION] = _Certification()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Turn clauses declared as known failures into strict xfails (a fixed one then fails loudly)."""
    known = {str(clause) for clause in config.getini(_KNOWN_FAILURES)}
    known.update(config.getoption("--mayfly-known-failure") or [])
    for item in items:
        clause = _clause(item)
        if clause is not None and clause in known:
            item.add_marker(
                pytest.mark.xfail(strict=True, reason=f"declared known failure of clause {clause}")
            )


def _factory_urls(config: pytest.Config) -> tuple[str, str] | None:
    spec = str(config.getini(_INI_FACTORY) or "").strip()
    if not spec:
        return None
    module_name, _, attribute = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attribute or "backend")
    produced = factory()
    if isinstance(produced, str):
        return produced, produced
    journal_url, leases_url = produced
    return str(journal_url), str(leases_url)


@pytest.fixture(scope="session")
def mayfly_journal_url(pytestconfig: pytest.Config) -> str:
    """The journal URL under test (from --mayfly-journal or the ini factory)."""
    url = pytestconfig.getoption(_JOURNAL_OPTION)
    if url:
        return str(url)
    produced = _factory_urls(pytestconfig)
    if produced is None:
        pytest.fail(
            "mayfly-contract needs a backend: pass --mayfly-journal URL, set the ini option "
            f"{_INI_FACTORY} = 'pkg.module:factory', or override the mayfly_journal_url fixture",
            pytrace=False,
        )
    return produced[0]


@pytest.fixture(scope="session")
def mayfly_leases_url(pytestconfig: pytest.Config, mayfly_journal_url: str) -> str:
    """The recovery-lease URL under test (default: the journal URL)."""
    url = pytestconfig.getoption(_LEASES_OPTION)
    if url:
        return str(url)
    produced = None if pytestconfig.getoption(_JOURNAL_OPTION) else _factory_urls(pytestconfig)
    return produced[1] if produced else mayfly_journal_url


@pytest.fixture(scope="session")
def mayfly_probe_runs() -> set[str]:
    """Every run id the suite hands out this session (purged from the store at the end)."""
    return set()


@pytest.fixture(scope="session")
def mayfly_journal(
    pytestconfig: pytest.Config, mayfly_journal_url: str, mayfly_probe_runs: set[str]
) -> Iterator[WorkflowJournal]:
    """The journal under test, opened once per session by URL; purges the session's probe runs at the end."""
    journal = open_journal(mayfly_journal_url)
    certification = pytestconfig.stash[_CERTIFICATION]
    certification.journal_url = journal.url
    certification.journal_type = f"{type(journal).__module__}.{type(journal).__qualname__}"
    certification.capabilities = journal.capabilities
    try:
        yield journal
        certification.probes = _purge_probes(journal, mayfly_probe_runs, pytestconfig.getoption(_KEEP_PROBES))
    finally:
        journal.close()


def _purge_probes(journal: WorkflowJournal, runs: set[str], keep: bool) -> str:
    """Purge the session's probe runs through the ``run_purge`` feature; return the report line."""
    purge = RUN_PURGE.of(journal)
    if keep or purge is None:
        why = f"{_KEEP_PROBES} was given" if keep else "the backend declares run_purge absent"
        return f"{len(runs)} probe run ids left in the store ({why})"
    purged = 0
    failures: list[str] = []
    for run_id in sorted(runs):
        try:
            purged += purge.purge_run(run_id)
        except MayflyError as error:  # a lease still held by a crashed child, a lost server...
            failures.append(f"{run_id}: {error}")
    line = f"{purged} probe runs purged from the store"
    if failures:
        line += f"; {len(failures)} could not be ({failures[0]})"
    return line


@pytest.fixture(scope="session")
def mayfly_leases(pytestconfig: pytest.Config, mayfly_leases_url: str) -> Iterator[RecoveryLeaseStore]:
    """The recovery-lease store under test, opened once per session by URL."""
    store = open_leases(mayfly_leases_url)
    pytestconfig.stash[_CERTIFICATION].lease_capabilities = store.capabilities
    yield store
    store.close()


@pytest.fixture(scope="session")
def mayfly_capabilities(mayfly_journal: WorkflowJournal) -> JournalCapabilities:
    """The capabilities the backend declares."""
    return mayfly_journal.capabilities


@pytest.fixture
def records(mayfly_probe_runs: set[str]) -> Records:
    """A factory of sealed records with fresh UUIDv7 event ids; its run ids are recorded as probes."""
    return Records(mayfly_probe_runs)


@pytest.fixture
def run_id(records: Records) -> str:
    """A fresh run id: contract tests never assume an empty store."""
    return records.new_id()


@pytest.fixture(autouse=True)
def _mayfly_capability_gate(request: pytest.FixtureRequest) -> None:
    """Skip a contract test whose required capability the backend declares absent."""
    if request.node.get_closest_marker("clause") is None:
        return
    required = [mark.args[0] for mark in request.node.iter_markers("capability")]
    if not required:
        return
    for name in required:
        if name in LeaseCapabilities.__struct_fields__:
            leases: RecoveryLeaseStore = request.getfixturevalue("mayfly_leases")
            declared, url = getattr(leases.capabilities, name), request.getfixturevalue("mayfly_leases_url")
            who = "lease store"
        else:
            capabilities: JournalCapabilities = request.getfixturevalue("mayfly_capabilities")
            declared, url = getattr(capabilities, name), request.getfixturevalue("mayfly_journal_url")
            who = "backend"
        if not declared:
            why = _ABSENT.get(name, "")
            pytest.skip(f"{who} {url_scheme(url)}:// declares capability {name} absent{why}")


def _clause(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("clause")
    return str(marker.args[0]) if marker is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the clause id to the report, and to the failure output."""
    report = yield
    clause = _clause(item)
    if clause is not None:
        report.user_properties.append(("mayfly_clause", clause))
        if report.failed:
            function = getattr(item, "function", None)
            doc = (getattr(function, "__doc__", None) or "").strip()
            report.sections.append(("mayfly contract clause", f"{clause}: {doc}"))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each clause's outcome for the certification report."""
    clause = dict(report.user_properties).get("mayfly_clause")
    if clause is None:
        return
    if report.when == "call" or report.skipped or (report.failed and report.when == "setup"):
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            text = str(report.longrepr)
            strict_xpass = text.startswith("[XPASS(strict)]")
            reason = f"{text}: it passes now" if strict_xpass else report.head_line or report.nodeid
        if hasattr(report, "wasxfail"):
            outcome, reason = "known", str(report.wasxfail)
        else:
            outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
        _session_certification.outcomes.setdefault(str(clause), []).append((outcome, reason))


# The logreport hook has no config argument; the configured instance is kept here.
_session_certification = _Certification()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Bind the report state of this session."""
    global _session_certification  # noqa: PLW0603  # one pytest session per process
    _session_certification = session.config.stash[_CERTIFICATION]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Print the certification report: backend, durability, capabilities and every clause."""
    certification = config.stash[_CERTIFICATION]
    if not certification.outcomes:
        return
    write = terminalreporter.write_line
    terminalreporter.section("mayfly contract certification")
    write(f"backend: {certification.journal_url or '(not opened)'} ({certification.journal_type})")
    capabilities = certification.capabilities
    if capabilities is not None:
        write(f"durability: {capabilities.durability}")
        flags = ", ".join(f"{name}={'yes' if getattr(capabilities, name) else 'no'}" for name in _FLAGS)
        write(f"capabilities: {flags}")
    leases = certification.lease_capabilities
    if leases is not None:
        names = LeaseCapabilities.__struct_fields__
        flags = ", ".join(f"{name}={'yes' if getattr(leases, name) else 'no'}" for name in names)
        write(f"lease store capabilities: {flags}")
    verdicts: dict[str, tuple[str, str]] = {}
    for clause, results in sorted(certification.outcomes.items()):
        failed = [reason for outcome, reason in results if outcome == "failed"]
        passed = [reason for outcome, reason in results if outcome == "passed"]
        known = [reason for outcome, reason in results if outcome == "known"]
        if failed:
            verdicts[clause] = ("FAIL", failed[0])
        elif known:
            verdicts[clause] = ("KNOWN", known[0])
        elif passed:
            verdicts[clause] = ("PASS", "")
        else:
            verdicts[clause] = ("SKIP", results[0][1])
    counts = {
        label: sum(1 for verdict, _ in verdicts.values() if verdict == label)
        for label in ("PASS", "FAIL", "SKIP", "KNOWN")
    }
    for clause, (verdict, reason) in verdicts.items():
        write(f"  {verdict} {clause}" + (f"  ({reason})" if reason else ""))
    write(
        f"clauses: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"(declared absent), {counts['KNOWN']} known failures"
    )
    if certification.probes:
        write(f"probe runs: {certification.probes}")
    if counts["FAIL"]:
        verdict = "NOT CERTIFIED"
    elif counts["KNOWN"]:
        verdict = f"NOT CERTIFIED ({counts['KNOWN']} declared known failure(s))"
    else:
        verdict = "CERTIFIED"
    write(f"verdict: {verdict}")
