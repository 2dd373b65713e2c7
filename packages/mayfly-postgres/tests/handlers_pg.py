"""Handlers for the worker process tests (``mayfly worker --handlers handlers_pg.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

from mayfly import HandlerRegistry, Succeeded
from mayfly.runtime import WaitForSignal, new_signal_token

registry = HandlerRegistry()


@registry.handler("step", version=1)
def step(request: Any) -> Succeeded:
    """A short step; its pause comes from TEST_STEP_S."""
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.01")))
    return Succeeded(output={"node": request.node_id})


@registry.handler("approve", version=1)
def approve(request: Any) -> Any:
    """Wait for an approval signal, writing the token where the test finds it (TEST_TOKENS/RUN)."""
    if request.signal is None:
        token = new_signal_token()
        path = os.path.join(os.environ["TEST_TOKENS"], request.run_id)
        with open(path + ".tmp", "w") as out:
            out.write(token.reveal())
        os.replace(path + ".tmp", path)
        return WaitForSignal("approval", token, timeout_ms=3_600_000)
    return Succeeded(output=request.signal.decision)
