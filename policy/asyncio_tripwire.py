"""Pytest plugin: fail any test in which an asyncio event loop is created or run.

ARCHITECTURE section 8: admitted drivers (psycopg, redis-py) may import the
standard library's ``asyncio`` module, but nothing in a Mayfly process may
create or run an event loop; the greenlet hub is the only scheduler. The static
audit (check_runtime_dependencies.py) cannot see what a dependency does at run
time, so this tripwire watches the process itself.

Enable it with ``-p asyncio_tripwire`` while ``policy/`` is on ``sys.path``
(``PYTHONPATH=policy`` in tox, or ``pythonpath = ["policy"]`` in the pytest
configuration). It patches ``asyncio.BaseEventLoop.__init__`` (every standard
library loop: selector and proactor, whether made by ``asyncio.run``,
``asyncio.Runner``, ``new_event_loop`` or an implicit ``get_event_loop``) and
``BaseEventLoop.run_forever`` (which ``run_until_complete`` uses), records each
event with the first frame outside asyncio, and fails the test phase (setup,
call or teardown) in which it happened. Events outside any test (at import or
collection) fail the session. It records rather than raising at the point of
creation so that code under test cannot swallow the error.

Child processes are Mayfly processes too (crash tests start real workers). The
plugin puts a ``sitecustomize`` on the children's ``PYTHONPATH`` that installs
the same patches and appends each event to a log file named by the
``MAYFLY_TRIPWIRE_LOG`` environment variable; forked children write there as
well. After each test phase the plugin reads what the log gained and fails the
phase like an in-process event. A child started with a scrubbed environment,
or a non-Python child, is not watched.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, Final

import pytest

_ASYNCIO_DIR: Final = asyncio.__file__.rsplit("/", 1)[0].rsplit("\\", 1)[0]
LOG_ENV: Final = "MAYFLY_TRIPWIRE_LOG"

# Installed as sitecustomize in every Python child of the test session. It must
# stay self-contained (the child has no pytest and may not see policy/), and it
# hands over to any other sitecustomize the interpreter would have run.
_CHILD_HOOK: Final = r"""
import os as _os
import sys as _sys

_LOG = _os.environ.get("MAYFLY_TRIPWIRE_LOG")
_HERE = _os.path.dirname(_os.path.abspath(__file__))
if _LOG:
    import asyncio as _asyncio
    import traceback as _traceback

    _ASYNCIO_DIR = _os.path.dirname(_asyncio.__file__)

    def _record(what):
        frames = _traceback.extract_stack()[:-2]
        origin = next(
            (
                f"{f.filename}:{f.lineno} in {f.name}"
                for f in reversed(frames)
                if not f.filename.startswith(_ASYNCIO_DIR) and f.filename != __file__
            ),
            "unknown origin",
        )
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"{what} at {origin} (child process {_os.getpid()})\n")

    _base = _asyncio.BaseEventLoop
    _init, _run = _base.__init__, _base.run_forever

    def _patched_init(self, *args, **kwargs):
        _record(f"event loop created ({type(self).__name__})")
        _init(self, *args, **kwargs)

    def _patched_run(self):
        _record(f"event loop run ({type(self).__name__})")
        _run(self)

    _base.__init__, _base.run_forever = _patched_init, _patched_run

import importlib.machinery as _machinery
import importlib.util as _util

_spec = _machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _HERE]
)
if _spec is not None and _spec.loader is not None:
    _next = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_next)
"""


class EventLoopTripped(AssertionError):
    """Raised into a test phase that created or ran an asyncio event loop."""


class _Recorder:
    """Thread-safe log of loop events, attributed to the test phase that is running.

    Events of this process are kept in memory; events of child processes
    (spawned with the child hook, or forked with these patches) arrive through
    the log file, read from the offset reached so far.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[str] = []
        self.orphans: list[str] = []
        self.phase: str | None = None
        self.pid = os.getpid()
        self.log: Path | None = None
        self._read_to = 0

    def record(self, what: str) -> None:
        """Record ``what`` with the innermost caller frame outside asyncio and this plugin."""
        frames = traceback.extract_stack()[:-2]
        origin = next(
            (
                f"{f.filename}:{f.lineno} in {f.name}"
                for f in reversed(frames)
                if not f.filename.startswith(_ASYNCIO_DIR) and f.filename != __file__
            ),
            "unknown origin",
        )
        if os.getpid() != self.pid:  # a forked child: only the log reaches the session
            if self.log is not None:
                with self.log.open("a", encoding="utf-8") as log:
                    log.write(f"{what} at {origin} (forked process {os.getpid()})\n")
            return
        entry = f"{what} at {origin} (thread {threading.current_thread().name})"
        with self._lock:
            (self._events if self.phase is not None else self.orphans).append(entry)

    def _drain_log(self) -> list[str]:
        if self.log is None or not self.log.exists():
            return []
        with self.log.open("rb") as log:
            log.seek(self._read_to)
            data = log.read()
        # Only whole lines: a child may be mid-write; the rest is read next time.
        complete = data[: data.rfind(b"\n") + 1]
        self._read_to += len(complete)
        return complete.decode("utf-8", "replace").splitlines()

    def start(self, phase: str) -> None:
        """Begin attributing events to ``phase``; child events logged before it are orphans."""
        with self._lock:
            self.orphans.extend(self._drain_log())
            self.phase = phase
            self._events = []

    def stop(self) -> list[str]:
        """Stop attributing and return the events recorded during the phase, children included."""
        with self._lock:
            events, self._events, self.phase = self._events + self._drain_log(), [], None
        return events

    def finish(self) -> list[str]:
        """Return every event recorded outside a test phase."""
        with self._lock:
            self.orphans.extend(self._drain_log())
            return list(self.orphans)


_RECORDER: Final = _Recorder()
_PATCHES: list[tuple[Any, str, Callable[..., Any]]] = []


def _install() -> None:
    base = asyncio.BaseEventLoop
    original_init = base.__init__
    original_run = base.run_forever

    def init(self: asyncio.BaseEventLoop, *args: Any, **kwargs: Any) -> None:
        _RECORDER.record(f"event loop created ({type(self).__name__})")
        original_init(self, *args, **kwargs)

    def run_forever(self: asyncio.BaseEventLoop) -> None:
        _RECORDER.record(f"event loop run ({type(self).__name__})")
        original_run(self)

    _PATCHES.extend([(base, "__init__", original_init), (base, "run_forever", original_run)])
    base.__init__ = init  # type: ignore[method-assign, assignment]
    base.run_forever = run_forever  # type: ignore[method-assign]


def _uninstall() -> None:
    while _PATCHES:
        owner, name, original = _PATCHES.pop()
        setattr(owner, name, original)


_CHILD_DIR: list[Path] = []
_SAVED_ENV: dict[str, str | None] = {}


def _watch_children() -> None:
    """Put the child hook on the children's PYTHONPATH and name the shared log."""
    hook_dir = Path(tempfile.mkdtemp(prefix="mayfly-tripwire-"))
    (hook_dir / "sitecustomize.py").write_text(_CHILD_HOOK, encoding="utf-8")
    log = hook_dir / "events.log"
    log.touch()
    for name in (LOG_ENV, "PYTHONPATH"):
        _SAVED_ENV[name] = os.environ.get(name)
    paths = [str(hook_dir), *filter(None, (os.environ.get("PYTHONPATH") or "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ[LOG_ENV] = str(log)
    _RECORDER.log = log
    _CHILD_DIR.append(hook_dir)


def _unwatch_children() -> None:
    for name, value in _SAVED_ENV.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _SAVED_ENV.clear()
    while _CHILD_DIR:
        shutil.rmtree(_CHILD_DIR.pop(), ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """Install the patches for the whole session and watch its child processes."""
    config.addinivalue_line("markers", "asyncio_tripwire: (reserved) the asyncio tripwire is active")
    if not _PATCHES:
        _install()
        _watch_children()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the patches and the child hook so an embedding process gets asyncio back untouched."""
    _uninstall()
    _unwatch_children()


def _guard(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    _RECORDER.start(f"{item.nodeid} ({phase})")
    try:
        result = yield
    except BaseException as exc:
        events = _RECORDER.stop()
        if events:
            raise EventLoopTripped(_message(phase, events)) from exc
        raise
    events = _RECORDER.stop()
    if events:
        raise EventLoopTripped(_message(phase, events))
    return result


def _message(phase: str, events: list[str]) -> str:
    lines = "\n  ".join(events)
    return (
        f"asyncio event loop activity during test {phase}; Mayfly's greenlet hub is the only "
        f"scheduler (ADR-0033, ARCHITECTURE section 8):\n  {lines}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    """Fail setup if a fixture created or ran an event loop."""
    return (yield from _guard(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Fail the test if its body created or ran an event loop."""
    return (yield from _guard(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Fail teardown if a finalizer created or ran an event loop."""
    return (yield from _guard(item, "teardown"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a loop was created outside every test (at import or collection)."""
    orphans = _RECORDER.finish()
    if orphans:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = _message("collection or session scope", orphans)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
