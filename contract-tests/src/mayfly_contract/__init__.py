"""mayfly-contract: the shared contract suite that certifies Mayfly journal and lease backends.

Run the whole suite against a backend by URL::

    pytest --pyargs mayfly_contract --mayfly-journal "file:///tmp/j"

The pytest plugin (:mod:`mayfly_contract.plugin`, registered through the
``pytest11`` entry point) adds the options, fixtures and markers, and prints
a certification report at the end. Test module paths and clause ids are
public: known-failure lists and docs refer to them.
"""

import pytest

# Failures inside the suite's helpers should show rewritten assertion diffs too.
pytest.register_assert_rewrite("mayfly_contract.reference", "mayfly_contract.support")

__all__ = ["CLAUSE_MARKER"]

CLAUSE_MARKER = "clause"
"""Name of the marker carrying a test's stable clause id."""
