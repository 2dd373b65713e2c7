"""Sphinx configuration for the Mayfly documentation (Markdown sources through MyST-Parser).

Build: ``sphinx-build --fail-on-warning --keep-going --builder html docs OUT``
(the tox ``docs`` env and ``nox -s docs`` do exactly this). Every warning fails
the build. Nitpicky mode is off on purpose: docstrings may cross-reference
internal modules that are not in the public API reference, and without network
access (no intersphinx) standard-library targets cannot resolve. No extension
here fetches anything, so the build is reproducible offline.
"""

from __future__ import annotations

from typing import Any

project = "Mayfly"
author = "Mayfly maintainers"
copyright = "2026, Mayfly maintainers"  # Sphinx reads this name

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "tests", "requirements.txt", "README.md"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = "Mayfly"
html_show_sourcelink = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Readable signatures: a callable type the contract names once is shown by that name
# (`relay: Relay`), and type names print without their module path.
autodoc_type_aliases = {"Relay": "mayfly.journal.Relay"}
python_use_unqualified_type_names = True
# undoc-members: the identity NewTypes (RunId, NodeId, ...) are public API without docstrings.
autodoc_default_options: dict[str, Any] = {"members": True, "undoc-members": True, "show-inheritance": True}

# The API reference: one line per public module. docs/api.md gets one section
# per entry, in this order, each rendered by autodoc from the module's
# docstrings. Only modules that are a public promise belong here (STYLE.md:
# users import from mayfly, mayfly.errors and mayfly.ids, and build plugin
# contexts with mayfly.plugins; backend authors import from the journal,
# lease, backend kit, hookspecs and testing modules, and make their waits
# with the substrate).
API_MODULES = [
    "mayfly",
    "mayfly.errors",
    "mayfly.ids",
    "mayfly.plugins",
    "mayfly.journal",
    "mayfly.lease",
    "mayfly.backend",
    "mayfly.hookspecs",
    "mayfly.testing",
    "mayfly.substrate",
]

# Names a module re-exports from another documented module, documented once, at their home (Sphinx
# refuses two descriptions of one object).
API_DOCUMENTED_ELSEWHERE = {
    "mayfly": ("MayflyError", "NonRetryable"),  # in mayfly.errors
    "mayfly.testing": ("DeterministicIdSource",),  # in mayfly.ids
    "mayfly.substrate": (  # in mayfly.errors
        "Deadlock",
        "HubAlreadyRunning",
        "HubNotRunning",
        "OffloadTimeout",
        "SubstrateError",
        "TaskCancelled",
        "TaskFailed",
        "TaskNotDone",
        "WaitTimeout",
    ),
}


def _append_api_sections(app: Any, docname: str, source: list[str]) -> None:
    """Append an autodoc section for each entry of API_MODULES to the API reference page."""
    if docname != "api":
        return
    # eval-rst: autodoc emits reStructuredText, and the docstrings are written in it.
    sections = []
    for module in API_MODULES:
        elsewhere = API_DOCUMENTED_ELSEWHERE.get(module, ())
        option = f"   :exclude-members: {', '.join(elsewhere)}\n" if elsewhere else ""
        sections.append(f"\n## `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}\n{option}```\n")
    source[0] += "".join(sections)


# Classes a reader uses but never constructs: their constructor is an implementation detail.
_NOT_CONSTRUCTED = frozenset({"mayfly.backend.BackendURL"})


def _readable_signature(  # noqa: PLR0917  # the signature Sphinx calls the event with
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, annotation: str | None
) -> tuple[str | None, str | None] | None:
    """Drop the meaningless ``(*args, **kwargs)`` of Protocols, and constructors nobody calls."""
    if what != "class":
        return None
    if getattr(obj, "_is_protocol", False) or name in _NOT_CONSTRUCTED:
        return "", annotation
    return None


def setup(app: Any) -> dict[str, Any]:
    """Register the API-reference hooks."""
    app.connect("source-read", _append_api_sections)
    app.connect("autodoc-process-signature", _readable_signature)
    return {"parallel_read_safe": True}
