"""The pytest11 plugin: its fixtures reach a user's test run through the installed entry point."""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = textwrap.dedent(
    """
    import pytest
    from mayfly import HandlerRegistry, Node, Succeeded, WaitForSignal, WorkflowSpec
    from mayfly.model.signals import SignalToken

    TOKEN = SignalToken("approval-token-for-tests")


    @pytest.fixture
    def mayfly_registry():
        registry = HandlerRegistry()

        @registry.handler("approve", cooperative=True)
        def approve(req):
            if req.signal is None:
                return WaitForSignal("approval", TOKEN, timeout_ms=3 * 86_400_000)
            return Succeeded(output={"by": req.signal.decision["by"]})

        return registry


    SPEC = WorkflowSpec("user.flow", 1, (Node("approve", handler="approve@1"),))


    def test_fixtures_share_one_env(mayfly_env, mayfly_clock, mayfly_runtime, mayfly_memory_journal):
        assert mayfly_clock is mayfly_env.clock and mayfly_runtime is mayfly_env.runtime
        assert mayfly_memory_journal.url.startswith("memory://")
        run = mayfly_env.start(SPEC)
        mayfly_env.advance(days=1)
        assert mayfly_clock.now_ms() == 86_400_000
        assert mayfly_env.signal(run, "approve", token=TOKEN, decision={"by": "bo"}).status == "accepted"
        assert mayfly_env.result(run).outputs["approve"] == {"by": "bo"}


    def test_each_test_gets_a_fresh_store(mayfly_env, mayfly_memory_journal):
        assert mayfly_env.now_ms == 0 and mayfly_memory_journal.list_runs() == []
    """
)


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    """mayfly-runtime declares the pytest11 entry point naming mayfly.testing.pytest_plugin."""
    (point,) = [ep for ep in entry_points(group="pytest11") if ep.name == "mayfly"]
    assert point.value == "mayfly.testing.pytest_plugin"
    assert point.dist is not None and point.dist.name == "mayfly-runtime"


def test_a_users_tests_get_the_fixtures_from_the_installed_plugin(pytester: pytest.Pytester) -> None:
    """A test file with no conftest of ours uses mayfly_env and friends, overriding mayfly_registry."""
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
