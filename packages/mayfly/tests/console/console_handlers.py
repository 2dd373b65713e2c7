"""Handlers of the `mayfly worker` process the console tests watch: ``hold@1`` runs until told to stop.

``hold@1`` waits (on its offload thread, so the worker's hub keeps renewing
the run's lease) until the file named by ``MAYFLY_CONSOLE_RELEASE`` exists,
then succeeds with an output that carries a canary.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mayfly import HandlerRegistry, HandlerRequest, NodeOutcome, Succeeded

registry = HandlerRegistry()


@registry.handler("hold")
def hold(req: HandlerRequest) -> NodeOutcome:
    """Hold the run (and so its lease) until the release file appears, for two minutes at most."""
    release = Path(os.environ["MAYFLY_CONSOLE_RELEASE"])
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return Succeeded(output={"held": "CANARY-CONSOLE-HELD-OUTPUT-3f1a", "echo": req.run_input})
