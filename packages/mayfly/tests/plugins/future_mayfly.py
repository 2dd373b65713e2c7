"""Run ``mayfly ARGS`` (or ``--script FILE``) as a Mayfly release that writes ``NodeReady`` at schema version 2.

Every event of this Mayfly is at version 1, so no real history needs an
upcaster yet. A release that changes ``NodeReady`` would write it at v2 and
read v1 histories only through an upcaster; this process is that release,
and nothing else differs.
"""

from __future__ import annotations

import runpy
import sys

from mayfly.model.events import EVENT_SCHEMA_VERSIONS

EVENT_SCHEMA_VERSIONS["NodeReady"] = 2

if sys.argv[1] == "--script":
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    from mayfly.cli import main

    raise SystemExit(main(sys.argv[1:]))
