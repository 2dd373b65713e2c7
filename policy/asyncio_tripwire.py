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
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Callable, Generator
from typing import Any, Final

import pytest

_ASYNCIO_DIR: Final = asyncio.__file__.rsplit("/", 1)[0].rsplit("\\", 1)[0]


class EventLoopTripped(AssertionError):
    """Raised into a test phase that created or ran an asyncio event loop."""


class _Recorder:
    """Thread-safe log of loop events, attributed to the test phase that is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[str] = []
        self.orphans: list[str] = []
        self.phase: str | None = None

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
        entry = f"{what} at {origin} (thread {threading.current_thread().name})"
        with self._lock:
            (self._events if self.phase is not None else self.orphans).append(entry)

    def start(self, phase: str) -> None:
        """Begin attributing events to ``phase``."""
        with self._lock:
            self.phase = phase
            self._events = []

    def stop(self) -> list[str]:
        """Stop attributing and return the events recorded during the phase."""
        with self._lock:
            events, self._events, self.phase = self._events, [], None
        return events


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


def pytest_configure(config: pytest.Config) -> None:
    """Install the patches for the whole session."""
    config.addinivalue_line("markers", "asyncio_tripwire: (reserved) the asyncio tripwire is active")
    if not _PATCHES:
        _install()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the patches so an embedding process gets asyncio back untouched."""
    _uninstall()


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
    if _RECORDER.orphans:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = _message("collection or session scope", _RECORDER.orphans)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
