"""The public surface of mayfly.substrate (its __init__): names, and the shared error hierarchy."""

from __future__ import annotations

from mayfly import substrate
from mayfly.model import errors


def test_every_public_name_resolves() -> None:
    """Each name in mayfly.substrate.__all__ is importable from the package."""
    missing = [name for name in substrate.__all__ if not hasattr(substrate, name)]
    assert missing == []


def test_substrate_errors_are_the_model_error_classes() -> None:
    """The substrate raises the classes of mayfly.model.errors, all under MayflyError."""
    for name in (
        "Deadlock",
        "HubAlreadyRunning",
        "HubNotRunning",
        "OffloadTimeout",
        "SubstrateError",
        "TaskCancelled",
        "TaskFailed",
        "TaskNotDone",
        "WaitTimeout",
    ):
        cls = getattr(substrate, name)
        assert cls is getattr(errors, name)
        assert issubclass(cls, errors.SubstrateError)
        assert issubclass(cls, errors.MayflyError)


def test_timeouts_are_timeout_errors_and_cancellation_is_not_a_failure() -> None:
    """WaitTimeout and OffloadTimeout are TimeoutErrors; TaskCancelled is distinct from TaskFailed."""
    assert issubclass(substrate.WaitTimeout, TimeoutError)
    assert issubclass(substrate.OffloadTimeout, substrate.WaitTimeout)
    assert not issubclass(substrate.TaskCancelled, substrate.TaskFailed)
    assert not issubclass(substrate.TaskFailed, substrate.TaskCancelled)
