"""The asyncio tripwire plugin, run in real pytest subprocesses."""

from __future__ import annotations

import os
from pathlib import Path

import asyncio_tripwire
import pytest

pytest_plugins = ["pytester"]

POLICY_DIR = str(Path(asyncio_tripwire.__file__).resolve().parent)


@pytest.fixture
def tripwire(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose subprocesses can load the plugin from policy/."""
    monkeypatch.setenv("PYTHONPATH", POLICY_DIR)
    # This suite may itself run under the tripwire; the inner sessions get their own.
    monkeypatch.delenv(asyncio_tripwire.LOG_ENV, raising=False)
    return pytester


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    """Run ``source`` as a test module in a fresh interpreter with the tripwire on."""
    pytester.makepyfile(test_subject=source)
    return pytester.runpytest_subprocess("-p", "asyncio_tripwire", "-p", "no:cacheprovider")


def test_asyncio_run_in_a_test_fails_that_test(tripwire: pytest.Pytester) -> None:
    """asyncio.run inside a test fails that test and names the event and the line that did it."""
    result = run(
        tripwire,
        """
import asyncio

async def main():
    return 1

def test_loop():
    assert asyncio.run(main()) == 1

def test_plain():
    assert True
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*EventLoopTripped: asyncio event loop activity during test call*",
            "*event loop created (_UnixSelectorEventLoop) at *test_subject.py:7 in test_loop*",
        ]
    )


def test_new_event_loop_in_a_fixture_fails_setup(tripwire: pytest.Pytester) -> None:
    """A fixture that creates a loop fails the test at setup, even if the test never touches it."""
    result = run(
        tripwire,
        """
import asyncio
import pytest

@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()

def test_uses_fixture(loop):
    assert True

def test_without_fixture():
    assert True
""",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*asyncio event loop activity during test setup*"])


def test_running_a_loop_made_at_import_fails_the_test_and_the_session(tripwire: pytest.Pytester) -> None:
    """A loop created at import fails the session; running it inside a test fails that test too."""
    result = run(
        tripwire,
        """
import asyncio

LOOP = asyncio.new_event_loop()

def test_runs_existing_loop():
    LOOP.run_until_complete(asyncio.sleep(0))
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*asyncio event loop activity during test collection or session scope*",
            "*event loop created (_UnixSelectorEventLoop) at *test_subject.py:3 in <module>*",
            "*event loop run (_UnixSelectorEventLoop) at *test_subject.py:6 in test_runs_existing_loop*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_importing_asyncio_without_a_loop_is_tolerated(tripwire: pytest.Pytester) -> None:
    """Importing asyncio (as admitted drivers do) and using its types without a loop passes."""
    result = run(
        tripwire,
        """
import asyncio
import asyncio.subprocess

def test_import_only():
    assert asyncio.iscoroutinefunction(print) is False
""",
    )
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK


def test_loop_swallowed_by_code_under_test_still_fails(tripwire: pytest.Pytester) -> None:
    """Code that creates a loop in a thread and hides every error still fails the test."""
    result = run(
        tripwire,
        """
import asyncio
import threading

def sneaky():
    try:
        asyncio.run(asyncio.sleep(0))
    except BaseException:
        pass

def test_thread_loop():
    t = threading.Thread(target=sneaky)
    t.start()
    t.join()
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*event loop created*thread Thread-1*"])


def test_loop_in_a_spawned_child_process_fails_the_test(tripwire: pytest.Pytester) -> None:
    """A Python child started by the test that runs an event loop fails that test, naming the child."""
    result = run(
        tripwire,
        """
import subprocess
import sys

def test_child_runs_a_loop():
    code = "import asyncio; asyncio.run(asyncio.sleep(0))"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_child_without_a_loop():
    subprocess.run([sys.executable, "-c", "import asyncio"], check=True)
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*event loop created (_UnixSelectorEventLoop) at <string>:1*child process*"])


def test_loop_in_a_forked_child_fails_the_test(tripwire: pytest.Pytester) -> None:
    """A forked child that creates a loop reports it through the log and fails the test."""
    result = run(
        tripwire,
        """
import asyncio
import os

def test_fork():
    pid = os.fork()
    if pid == 0:
        asyncio.new_event_loop()
        os._exit(0)
    os.waitpid(pid, 0)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*event loop created*forked process*"])


def test_an_existing_sitecustomize_still_runs_in_children(
    tripwire: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child hook hands over to the sitecustomize the environment already had."""
    own = tripwire.mkdir("own_site")
    marker = tripwire.path / "marker.txt"
    (own / "sitecustomize.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(os.environ.get('WHO', 'session') + '\\n')\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([POLICY_DIR, str(own)]))
    result = run(
        tripwire,
        """
import os
import subprocess
import sys

def test_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True, env={**os.environ, "WHO": "child"})
""",
    )
    result.assert_outcomes(passed=1)
    assert "child" in marker.read_text(encoding="utf-8").split()
