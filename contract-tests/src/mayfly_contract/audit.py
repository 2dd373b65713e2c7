"""Audit a dependency graph and its sources against Mayfly's runtime-dependency policy (ADR-0033).

Two modes, one set of rules.

**Your own distribution** (a third-party backend, from outside the Mayfly
repository, with no lock of ours)::

    python -m mayfly_contract.audit dist/mayfly_mystore-1.0-py3-none-any.whl
    python -m mayfly_contract.audit .                    # a project directory
    python -m mayfly_contract.audit mayfly-mystore       # an installed distribution
    python -m mayfly_contract.audit -r requirements.txt  # a requirements file

Each target's requirements (every extra, dependency group and build
requirement a project declares) are walked to every distribution they reach,
and its Python files are scanned. ``--resolve installed`` (the default) reads
the dependency metadata of the environment the command runs in, offline, for
that environment's interpreter and platform; ``--resolve index`` resolves
every edge against a package index (``--index``, default PyPI) for every
target of the policy, the way Mayfly audits itself (this needs network and
``packaging``). Mayfly's own distributions are not walked: Mayfly's audit
covers them. The policy is the one shipped with this module, the same as
the repository's ``policy/runtime-dependency-policy.toml``.

**The Mayfly repository** (no target given): the mode below, which
``python3 policy/check_runtime_dependencies.py --all-targets`` runs on a
checkout.

The dependency audit walks every distribution in this repository (packages/*,
contract-tests and its examples, the workspace root), all of their extras,
dependency groups and build-system requirements, every tox env's deps, the
noxfile's installs and the tooling list in the policy file. Environment markers
are evaluated for every Python version x platform x machine in the policy's
``[targets]``. Third-party metadata comes from the committed lock
``policy/dependency-graph.lock.json`` (refreshed with ``--refresh``), so a
normal run is offline, deterministic and fast. Every path that reaches a banned
distribution is printed with versions and the markers it crossed; a path not in
the policy's ledger fails, and so does a ledger entry that no longer matches a
path. The source scan parses our own Python (and the fenced ``python`` blocks of
docs/**/*.md) and flags asyncio, ``async``/``await``, imports of banned modules
and thread or executor creation outside the substrate.

Exit status: 0 clean, 1 violations, 2 usage error or stale lock.
Standard library only, except ``--refresh``, which needs ``packaging``.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import dataclasses
import email.parser
import functools
import importlib.metadata
import io
import json
import os
import platform
import re
import sys
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

POLICY_DIR: Final = Path(__file__).resolve().parent
DEFAULT_ROOT = (
    POLICY_DIR.parent
)  # the repository root; policy/check_runtime_dependencies.py sets its checkout
PACKAGED_POLICY: Final = POLICY_DIR / "runtime-dependency-policy.toml"
"""The policy shipped beside this module (a copy of the repository's, kept identical by a test)."""
POLICY_FILE: Final = "policy/runtime-dependency-policy.toml"
LOCK_FILE: Final = "policy/dependency-graph.lock.json"
LOCK_FORMAT: Final = 1
REFRESH_HINT: Final = "run `python3 policy/check_runtime_dependencies.py --refresh` and commit the lock"
ARROW: Final = " -> "

EXIT_CLEAN: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_USAGE: Final = 2


class AuditError(Exception):
    """Input the audit cannot trust (bad policy, bad pyproject, unparsable requirement): exit 2."""


class StaleLock(AuditError):
    """The committed lock does not describe the repository's current requirements."""


def canonical_name(name: str) -> str:
    """Normalize a distribution or extra name as PEP 503/685 do."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------
# PEP 508 markers: a small three-valued evaluator. True/False when decidable in
# a target environment, None ("unknown") otherwise; the walker follows an edge
# unless its marker is definitely False, so the unknown case over-approximates.
# ---------------------------------------------------------------------------

_MARKER_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'[^']*'|"[^"]*")
      | (?P<op>===|==|!=|<=|>=|~=|<|>|\bnot\s+in\b|\bin\b)
      | (?P<bool>\band\b|\bor\b)
      | (?P<paren>[()])
      | (?P<var>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)
_VAR_ALIASES: Final = {
    "os.name": "os_name",
    "sys.platform": "sys_platform",
    "platform.version": "platform_version",
    "platform.machine": "platform_machine",
    "platform.python_implementation": "platform_python_implementation",
    "python_implementation": "platform_python_implementation",
}
_VERSION_VARS: Final = frozenset({"python_version", "python_full_version", "implementation_version"})
# A target environment stands for every patch release of one Python series from
# its floor up; this key of the target's env names the floor (default X.Y.0).
# It is not a PEP 508 variable: python_full_version and implementation_version
# are evaluated over the whole range, never as one value.
FLOOR_VAR: Final = "python_full_version_floor"
HIGH_PATCH: Final = 9999  # stands for "the newest patch release of the series"
_RELEASE = re.compile(r"^\d+(?:\.\d+)*$")

Tri = bool | None
Env = Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class _Cmp:
    left: tuple[str, str]  # ("var"|"str", value)
    op: str
    right: tuple[str, str]


@dataclasses.dataclass(frozen=True)
class _BoolOp:
    op: str  # "and" | "or"
    items: tuple[_Node, ...]


_Node = _Cmp | _BoolOp


class Marker:
    """A parsed PEP 508 environment marker, evaluated in three-valued logic."""

    def __init__(self, text: str) -> None:
        """Parse ``text``; raise AuditError naming the marker when it is malformed."""
        self.text = text.strip()
        tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _MARKER_TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise AuditError(f"malformed environment marker {text!r} at offset {pos}")
            kind = m.lastgroup
            assert kind is not None
            value = m.group(kind)
            if kind == "op":
                value = re.sub(r"\s+", " ", value)
            tokens.append((kind, value))
            pos = m.end()
        self._tokens = tokens
        self._pos = 0
        self._tree = self._parse_or()
        if self._pos != len(tokens):
            raise AuditError(f"malformed environment marker {text!r}: trailing tokens")
        del self._tokens

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self) -> tuple[str, str]:
        tok = self._peek()
        if tok is None:
            raise AuditError(f"malformed environment marker {self.text!r}: unexpected end")
        self._pos += 1
        return tok

    def _parse_or(self) -> _Node:
        items = [self._parse_and()]
        while self._peek() == ("bool", "or"):
            self._take()
            items.append(self._parse_and())
        return items[0] if len(items) == 1 else _BoolOp("or", tuple(items))

    def _parse_and(self) -> _Node:
        items = [self._parse_atom()]
        while self._peek() == ("bool", "and"):
            self._take()
            items.append(self._parse_atom())
        return items[0] if len(items) == 1 else _BoolOp("and", tuple(items))

    def _parse_atom(self) -> _Node:
        if self._peek() == ("paren", "("):
            self._take()
            node = self._parse_or()
            if self._take() != ("paren", ")"):
                raise AuditError(f"malformed environment marker {self.text!r}: unbalanced '('")
            return node
        left = self._operand()
        kind, op = self._take()
        if kind != "op":
            raise AuditError(f"malformed environment marker {self.text!r}: expected an operator")
        return _Cmp(left, op, self._operand())

    def _operand(self) -> tuple[str, str]:
        kind, value = self._take()
        if kind == "str":
            return ("str", value[1:-1])
        if kind == "var":
            return ("var", _VAR_ALIASES.get(value, value))
        raise AuditError(f"malformed environment marker {self.text!r}: unexpected {value!r}")

    def evaluate(self, env: Env, extras: Iterable[str] = ()) -> Tri:
        """Evaluate in ``env``; ``extras`` are the extras requested of the owning distribution."""
        wanted = {canonical_name(e) for e in extras}
        return _eval(self._tree, env, wanted)

    def mentions_extra(self) -> bool:
        """Tell whether the marker tests ``extra``."""
        return _mentions_extra(self._tree)

    def __str__(self) -> str:
        return self.text


def _mentions_extra(node: _Node) -> bool:
    if isinstance(node, _BoolOp):
        return any(_mentions_extra(i) for i in node.items)
    return ("var", "extra") in (node.left, node.right)


def _eval(node: _Node, env: Env, extras: set[str]) -> Tri:
    if isinstance(node, _BoolOp):
        results = [_eval(i, env, extras) for i in node.items]
        if node.op == "and":
            if any(r is False for r in results):
                return False
            return True if all(r is True for r in results) else None
        if any(r is True for r in results):
            return True
        return False if all(r is False for r in results) else None
    return _eval_cmp(node, env, extras)


_FLIP: Final = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "==", "!=": "!=", "===": "==="}


def _eval_cmp(node: _Cmp, env: Env, extras: set[str]) -> Tri:
    left, op, right = node.left, node.op, node.right
    if left[0] == "str" and right[0] == "var" and op in _FLIP:
        left, op, right = right, _FLIP[op], left
    if left == ("var", "extra") and right[0] == "str":
        if op not in ("==", "!="):
            return None
        hit = canonical_name(right[1]) in extras
        return hit if op == "==" else not hit
    if left[0] == "var" and right[0] == "str" and left[1] in _VERSION_VARS:
        return _eval_version(left[1], op, right[1], env)
    lhs = env.get(left[1]) if left[0] == "var" else left[1]
    rhs = env.get(right[1]) if right[0] == "var" else right[1]
    if lhs is None or rhs is None:
        return None
    if op == "in":
        return lhs in rhs
    if op == "not in":
        return lhs not in rhs
    if op in ("==", "==="):
        return lhs == rhs
    if op == "!=":
        return lhs != rhs
    return None  # ordering comparisons on non-version strings are undefined in PEP 508


def _release(text: str) -> tuple[int, ...] | None:
    return tuple(int(p) for p in text.split(".")) if _RELEASE.match(text) else None


def _cmp_release(a: tuple[int, ...], op: str, b_text: str) -> Tri:
    if op in ("==", "!=") and b_text.endswith(".*"):
        prefix = _release(b_text[:-2])
        if prefix is None:
            return None
        hit = a[: len(prefix)] == prefix
        return hit if op == "==" else not hit
    b = _release(b_text)
    if b is None:
        return None
    width = max(len(a), len(b))
    pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    if op == "~=":
        if len(b) < 2:
            return None
        return pa >= pb and a[: len(b) - 1] == b[:-1]
    table: dict[str, Callable[[], bool]] = {
        "==": lambda: pa == pb,
        "===": lambda: pa == pb,
        "!=": lambda: pa != pb,
        "<": lambda: pa < pb,
        "<=": lambda: pa <= pb,
        ">": lambda: pa > pb,
        ">=": lambda: pa >= pb,
    }
    fn = table.get(op)
    return fn() if fn is not None else None


def _eval_version(var: str, op: str, rhs: str, env: Env) -> Tri:
    minor = env.get("python_version")
    if minor is None:
        return None
    base = _release(minor)
    if base is None:
        return None
    if var == "python_version":
        return _cmp_release(base, op, rhs)
    # A target is a whole series of patch releases, from its floor (X.Y.0 unless
    # the policy names a later one) up. The ordering operators are monotone over
    # it, so the floor and a far-high patch decide them when they agree.
    floor = _release(env.get(FLOOR_VAR, f"{minor}.0"))
    if floor is None or len(floor) != len(base) + 1 or floor[: len(base)] != base:
        return None
    high = (*base, HIGH_PATCH)
    low = _cmp_release(floor, op, rhs)
    if low != _cmp_release(high, op, rhs):
        return None
    # Equality singles out releases: `== "3.11.5"` is false at both ends of the
    # 3.11 series yet true inside it. When the release it names lies in the
    # series, the answer there differs from the ends, so it is only "possibly".
    named = _release(rhs.removesuffix(".*"))
    if op in ("==", "!=", "===") and named is not None:
        point = (*named, 0, 0)[: len(floor)]
        if floor <= point <= high and _cmp_release(point, op, rhs) != low:
            return None
    return low


def specifier_admits(spec: str, version: str) -> Tri:
    """Evaluate a comma-joined release specifier (e.g. a Requires-Python) at a plain release."""
    v = _release(version)
    if v is None:
        return None
    result: Tri = True
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"^(===|==|!=|<=|>=|~=|<|>)\s*(.+)$", clause)
        if m is None:
            return None
        r = _cmp_release(v, m.group(1), m.group(2).strip())
        if r is False:
            return False
        if r is None:
            result = None
    return result


# ---------------------------------------------------------------------------
# PEP 508 requirements.
# ---------------------------------------------------------------------------

_REQ = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>.*)$"
)


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One dependency edge as declared: name, requested extras, specifier, marker, origin."""

    name: str
    extras: frozenset[str]
    specifier: str
    marker: Marker | None
    url: str | None
    raw: str

    @classmethod
    def parse(cls, text: str) -> Requirement:
        """Parse a PEP 508 requirement; raise AuditError naming it when malformed."""
        m = _REQ.match(text)
        if m is None:
            raise AuditError(f"malformed requirement {text!r}")
        rest = m.group("rest").strip()
        url: str | None = None
        marker_text: str | None = None
        if rest.startswith("@"):
            url_part, sep, marker_part = rest[1:].partition(" ;")
            url = url_part.strip()
            marker_text = marker_part if sep else None
        else:
            spec_part, sep, marker_part = rest.partition(";")
            rest = spec_part.strip()
            marker_text = marker_part if sep else None
        spec = ""
        if url is None:
            spec = rest.strip()
            if spec.startswith("(") and spec.endswith(")"):
                spec = spec[1:-1]
            spec = ",".join(sorted(c.replace(" ", "") for c in spec.split(",") if c.strip()))
            if spec and not re.fullmatch(r"((===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+,?)+", spec):
                raise AuditError(f"malformed version specifier in requirement {text!r}")
        extras_text = m.group("extras") or ""
        extras = frozenset(canonical_name(e) for e in extras_text.split(",") if e.strip())
        marker = Marker(marker_text) if marker_text and marker_text.strip() else None
        return cls(canonical_name(m.group("name")), extras, spec, marker, url, text.strip())

    def describe(self) -> str:
        """Render the requirement canonically: name, sorted extras, normalized specifier, marker."""
        extras = f"[{','.join(sorted(self.extras))}]" if self.extras else ""
        marker = f"; {self.marker}" if self.marker else ""
        target = f" @ {self.url}" if self.url else self.specifier
        return f"{self.name}{extras}{target}{marker}"


@functools.cache
def _parse_requirement(text: str) -> Requirement:
    """Parse third-party Requires-Dist once per run: the walk meets each one on every target."""
    return Requirement.parse(text)


# ---------------------------------------------------------------------------
# Policy.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """One target environment: a Python series (from its floor release up) on one platform and machine."""

    python: str
    platform: str
    machine: str
    env: Mapping[str, str]

    @property
    def label(self) -> str:
        """Short name such as ``py3.12-win32-AMD64``."""
        return f"py{self.python}-{self.platform}-{self.machine}"


@dataclasses.dataclass(frozen=True)
class Comparator:
    """A banned distribution admitted as a benchmark comparator in exactly one nox session's venv."""

    name: str
    version: str
    session: str
    sources: tuple[str, ...]  # the only files that may import its modules

    @property
    def root_label(self) -> str:
        """The walk root of its session, as printed."""
        return f"noxfile.py [session {self.session}]"


@dataclasses.dataclass(frozen=True)
class Policy:
    """The parsed runtime-dependency policy."""

    banned: Mapping[str, str]
    banned_modules: Mapping[str, str]
    tolerated: frozenset[str]
    ledger: Mapping[str, str]
    first_party: frozenset[str]
    tooling: tuple[str, ...]
    pythons: tuple[str, ...]  # the audited series, e.g. "3.11": labels and lock keys
    python_floors: Mapping[str, str]  # series -> its lowest audited release, e.g. "3.11" -> "3.11.3"
    targets: tuple[Target, ...]
    scan_roots: tuple[str, ...]
    thread_rule_roots: tuple[str, ...]
    thread_owners: tuple[str, ...]
    comparators: Mapping[str, Comparator] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Policy:
        """Read and validate the policy file; raise AuditError saying what is wrong."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise AuditError(f"cannot read policy {path}: {exc}") from exc
        try:
            banned = {canonical_name(b["name"]): b["why"] for b in data["banned"]}
            modules = {m: canonical_name(b["name"]) for b in data["banned"] for m in b["modules"]}
            ledger = {e["path"]: e["why"] for e in data.get("ledger", [])}
            tolerated = {canonical_name(x["name"]): x["why"] for x in data.get("tolerated", [])}
            both = sorted(set(banned) & set(tolerated))
            if both:
                raise AuditError(
                    f"policy {path} lists {', '.join(both)} both as [[banned]] and as [[tolerated]]; "
                    "a distribution is one or the other"
                )
            comparators = _comparators(data.get("comparator", []), banned, path)
            t = data["targets"]
            floors = _python_floors(t["python_versions"], path)
            pythons = tuple(floors)
            impl = t["implementation"]
            targets = []
            for py in pythons:
                for plat in t["platforms"]:
                    for machine in plat["machines"]:
                        env = {
                            "python_version": py,
                            FLOOR_VAR: floors[py],
                            "implementation_name": impl,
                            "platform_python_implementation": {"cpython": "CPython"}.get(impl, impl),
                            "sys_platform": plat["sys_platform"],
                            "platform_system": plat["platform_system"],
                            "os_name": plat["os_name"],
                            "platform_machine": machine,
                        }
                        targets.append(Target(py, plat["sys_platform"], machine, env))
            scan = data["source_scan"]
            return cls(
                banned=banned,
                banned_modules=modules,
                tolerated=frozenset(tolerated),
                ledger=ledger,
                first_party=frozenset(canonical_name(n) for n in data["first_party"]["names"]),
                tooling=tuple(data.get("tooling", {}).get("requirements", [])),
                pythons=pythons,
                python_floors=floors,
                targets=tuple(targets),
                scan_roots=tuple(scan["roots"]),
                thread_rule_roots=tuple(scan["thread_rule_roots"]),
                thread_owners=tuple(scan["thread_owners"]),
                comparators=comparators,
            )
        except (KeyError, TypeError) as exc:
            raise AuditError(f"policy {path} is missing or mistypes {exc}; see its header comments") from exc


def _comparators(entries: object, banned: Mapping[str, str], path: Path) -> dict[str, Comparator]:
    """Read ``[[comparator]]``: each must be banned, pinned to one version, and name one nox session."""
    if not isinstance(entries, list):
        raise AuditError(f"policy {path}: [[comparator]] must be an array of tables")
    out: dict[str, Comparator] = {}
    for entry in entries:
        name = canonical_name(entry["name"])
        where = f"policy {path}: [[comparator]] {name}"
        if name not in banned:
            raise AuditError(
                f"{where} is not [[banned]]; a comparator is a banned distribution admitted in one "
                "benchmark session's venv, never a dependency"
            )
        version, session, sources = entry["version"], entry["session"], entry["sources"]
        if not isinstance(version, str) or not _RELEASE.match(version):
            raise AuditError(f'{where}: version must be one exact release such as "3.4.0", not {version!r}')
        if not isinstance(session, str) or not session.isidentifier():
            raise AuditError(f"{where}: session must name one nox session, not {session!r}")
        if not isinstance(sources, list) or not sources or not all(isinstance(s, str) for s in sources):
            raise AuditError(f"{where}: sources must list the directories that may import it")
        if name in out:
            raise AuditError(f"{where} is listed twice")
        out[name] = Comparator(name, version, session, tuple(sources))
    return out


def _python_floors(entries: object, path: Path) -> dict[str, str]:
    """Read ``[targets] python_versions``: series ("3.12") or series from a patch release ("3.11.3").

    Return series -> floor release in declaration order, e.g. {"3.11": "3.11.3", "3.12": "3.12.0"}.
    """
    if not isinstance(entries, list) or not entries:
        raise AuditError(f"policy {path}: [targets] python_versions must be a non-empty list")
    floors: dict[str, str] = {}
    last = (-1, -1)
    for entry in entries:
        m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", entry) if isinstance(entry, str) else None
        if m is None:
            raise AuditError(f"policy {path}: [targets] python_versions entry {entry!r} is not X.Y or X.Y.Z")
        key = (int(m.group(1)), int(m.group(2)))
        series = f"{key[0]}.{key[1]}"
        if series in floors:
            raise AuditError(f"policy {path}: [targets] python_versions names Python {series} twice")
        if key < last:
            raise AuditError(f"policy {path}: [targets] python_versions must ascend; {entry!r} does not")
        last = key
        floors[series] = f"{series}.{int(m.group(3) or 0)}"
    return floors


# ---------------------------------------------------------------------------
# The repository: first-party distributions and every place that declares a
# dependency (roots of the walk).
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LocalDist:
    """A distribution whose pyproject.toml lives in this repository."""

    name: str
    version: str
    path: str
    requires_python: str
    dependencies: tuple[Requirement, ...]
    optional: Mapping[str, tuple[Requirement, ...]]


@dataclasses.dataclass(frozen=True)
class Root:
    """A starting point of the walk: a label (as printed), the requirements it declares, its extras.

    ``extras`` are in force for the requirements' markers (a wheel's
    ``Requires-Dist: x; extra == "fast"`` is walked from the root of extra ``fast``).
    """

    label: str
    requirements: tuple[Requirement, ...]
    extras: frozenset[str] = frozenset()


@dataclasses.dataclass
class Repo:
    """What the repository declares."""

    dists: dict[str, LocalDist]
    by_path: dict[str, str]
    roots: list[Root]
    notes: list[str]
    outside: bool = False  # auditing a distribution from outside the Mayfly repository


def _pyproject_paths(root: Path) -> list[Path]:
    patterns = [
        "pyproject.toml",
        "packages/*/pyproject.toml",
        "contract-tests/pyproject.toml",
        "contract-tests/examples/*/pyproject.toml",
    ]
    found = {p for pat in patterns for p in root.glob(pat)}
    return sorted(found)


def _reqs(values: object, where: str) -> tuple[Requirement, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise AuditError(f"{where} must be a list of requirement strings")
    try:
        return tuple(Requirement.parse(v) for v in values)
    except AuditError as exc:
        raise AuditError(f"{where}: {exc}") from exc


def _group_reqs(
    groups: Mapping[str, Any], name: str, where: str, seen: tuple[str, ...] = ()
) -> tuple[Requirement, ...]:
    """Expand a PEP 735 dependency group, following include-group entries."""
    if name in seen:
        raise AuditError(f"{where}: dependency group {name!r} includes itself")
    out: list[Requirement] = []
    for item in groups.get(name, []):
        if isinstance(item, dict) and "include-group" in item:
            out.extend(_group_reqs(groups, item["include-group"], where, (*seen, name)))
        elif isinstance(item, str):
            out.extend(_reqs([item], f"{where} [dependency-groups] {name}"))
        else:
            raise AuditError(
                f"{where}: dependency group {name!r} has an entry that is neither a string nor include-group"
            )
    return tuple(out)


def load_repo(root: Path, policy: Policy) -> Repo:
    """Collect first-party distributions and every dependency root of the repository."""
    dists: dict[str, LocalDist] = {}
    by_path: dict[str, str] = {}
    roots: list[Root] = []
    notes: list[str] = []
    for path in _pyproject_paths(root):
        rel = path.parent.relative_to(root).as_posix() or "."
        where = f"{rel}/pyproject.toml" if rel != "." else "pyproject.toml"
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise AuditError(f"cannot parse {where}: {exc}") from exc
        project = data.get("project")
        label_base = "workspace root"
        if project is not None:
            name = canonical_name(project["name"])
            version = str(project.get("version", "dynamic"))
            rp = str(project.get("requires-python", ""))
            optional = {
                canonical_name(k): _reqs(v, f"{where} [project.optional-dependencies] {k}")
                for k, v in project.get("optional-dependencies", {}).items()
            }
            dist = LocalDist(
                name,
                version,
                rel,
                rp,
                _reqs(project.get("dependencies", []), f"{where} [project] dependencies"),
                optional,
            )
            if name in dists:
                raise AuditError(
                    f"two pyproject files declare distribution {name}: {dists[name].path} and {rel}"
                )
            dists[name] = dist
            by_path[rel] = name
            label_base = f"{name} {version}"
            roots.append(Root(label_base, dist.dependencies))
            for extra, reqs in sorted(optional.items()):
                roots.append(Root(f"{label_base} [extra {extra}]", reqs))
            if rp:
                _check_requires_python(rp, where, policy)
        groups = data.get("dependency-groups", {})
        for group in sorted(groups):
            roots.append(Root(f"{label_base} [group {group}]", _group_reqs(groups, group, where)))
        build = data.get("build-system", {}).get("requires")
        if build is not None:
            roots.append(
                Root(f"{label_base} [build-system]", _reqs(build, f"{where} [build-system] requires"))
            )
    repo = Repo(dists, by_path, roots, notes)
    _tox_roots(root, repo)
    _nox_roots(root, repo)
    if policy.tooling:
        repo.roots.append(Root("policy tooling", _reqs(list(policy.tooling), f"{POLICY_FILE} [tooling]")))
    return repo


def _check_requires_python(rp: str, where: str, policy: Policy) -> None:
    """Fail unless ``rp`` admits every audited release and nothing below the audited range.

    The audit proves nothing about a Python it does not walk, so a distribution
    must not install on one: not on an older series, and not on a patch release
    below a series' floor (a target "3.11.3" decides python_full_version markers
    as false below 3.11.3, so requires-python must keep 3.11.0-3.11.2 out too).
    """
    for floor in policy.python_floors.values():
        if specifier_admits(rp, floor) is False:
            raise AuditError(
                f"{where}: requires-python {rp!r} excludes Python {floor}, "
                "which the policy audits; fix one of them"
            )
    lowest = _release(policy.pythons[0])
    assert lowest is not None  # _python_floors validated the series
    for minor in range(lowest[1]):
        series = f"{lowest[0]}.{minor}"
        if any(specifier_admits(rp, f"{series}.{patch}") is True for patch in (0, HIGH_PATCH)):
            raise AuditError(
                f"{where}: requires-python {rp!r} admits Python {series}, "
                "which the policy does not audit; add it to [targets]"
            )
    for series, floor in policy.python_floors.items():
        for patch in range(int(floor.rsplit(".", 1)[1])):
            below = f"{series}.{patch}"
            if specifier_admits(rp, below) is True:
                raise AuditError(
                    f"{where}: requires-python {rp!r} admits Python {below}, below the audited "
                    f"floor {floor} of [targets]; raise requires-python to >={floor} or lower the floor"
                )


def _local_requirement(repo: Repo, text: str, where: str) -> Requirement:
    """Turn a local path install (``-e packages/mayfly[redis]``) into a first-party requirement."""
    m = re.match(r"^(?:\{toxinidir\}/)?\.?/?(?P<path>[^\[\s]+?)/?(?:\[(?P<extras>[^\]]*)\])?$", text)
    if m is None:
        raise AuditError(f"{where}: cannot read local install {text!r}")
    path = m.group("path").rstrip("/") or "."
    name = repo.by_path.get(path)
    if name is None:
        raise AuditError(
            f"{where}: {text!r} is not a distribution in this repository "
            f"(no {path}/pyproject.toml with [project])"
        )
    extras = m.group("extras")
    return Requirement.parse(f"{name}[{extras}]" if extras else name)


def _install_lines(
    root: Path, repo: Repo, lines: Iterable[str], where: str, depth: int = 0
) -> list[Requirement]:
    """Read pip-style install arguments: requirements, ``-e``/local paths and ``-r`` files."""
    out: list[Requirement] = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r", "--requirement")):
            ref = line.split(None, 1)[1] if " " in line else line[2:]
            ref = ref.strip().removeprefix("{toxinidir}/")
            target = root / ref
            if depth > 5 or not target.is_file():
                raise AuditError(f"{where}: requirements file {ref!r} does not exist")
            text = target.read_text(encoding="utf-8").splitlines()
            out.extend(_install_lines(root, repo, text, f"{ref}", depth + 1))
        elif line.startswith(("-c", "--constraint")):
            continue  # constraints narrow versions; they never add a dependency
        elif line.startswith(("-e", "--editable")):
            out.append(_local_requirement(repo, line.split(None, 1)[1], where))
        elif line.startswith("-"):
            raise AuditError(
                f"{where}: unsupported install option {line!r}; the audit cannot see what it adds"
            )
        elif line.startswith((".", "/", "{toxinidir}")) or ("/" in line.split(";")[0] and "@" not in line):
            out.append(_local_requirement(repo, line, where))
        else:
            try:
                out.append(Requirement.parse(line))
            except AuditError as exc:
                raise AuditError(f"{where}: {exc}") from exc
    return out


def _tox_roots(root: Path, repo: Repo) -> None:
    path = root / "tox.ini"
    if not path.is_file():
        return
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(path, encoding="utf-8")
    if cfg.has_option("tox", "requires"):
        reqs = _install_lines(root, repo, cfg.get("tox", "requires").splitlines(), "tox.ini [tox] requires")
        repo.roots.append(Root("tox.ini [tox] requires", tuple(reqs)))
    base = cfg.get("testenv", "deps", fallback="")
    for section in cfg.sections():
        if section != "testenv" and not section.startswith("testenv:"):
            continue
        deps = cfg.get(section, "deps", fallback=base)
        deps = deps.replace("{[testenv]deps}", base)
        reqs = _install_lines(root, repo, deps.splitlines(), f"tox.ini [{section}] deps")
        repo.roots.append(Root(f"tox.ini [{section}]", tuple(reqs)))


def _nox_roots(root: Path, repo: Repo) -> None:
    """Read ``session.install(...)`` string arguments from noxfile.py (flags pair with the next argument)."""
    path = root / "noxfile.py"
    if not path.is_file():
        return
    tree = ast.parse(path.read_text(encoding="utf-8"), filename="noxfile.py")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.FunctionDef)):
            continue
        lines: list[str] = []
        for call in ast.walk(node):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "install"
            ):
                continue
            args = list(call.args)
            i = 0
            while i < len(args):
                arg = args[i]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    text = arg.value
                    nxt = args[i + 1] if i + 1 < len(args) else None
                    if (
                        text in ("-e", "-r", "-c", "--editable", "--requirement")
                        and isinstance(nxt, ast.Constant)
                        and isinstance(nxt.value, str)
                    ):
                        text = f"{text} {nxt.value}"
                        i += 1
                    elif text in ("-e", "--editable") and nxt is not None:
                        # An editable install of a computed path can only be one of
                        # our checkouts; every repository distribution is already a
                        # root of the walk, so nothing unseen enters this way.
                        i += 2
                        continue
                    lines.append(text)
                else:
                    raise AuditError(
                        f"noxfile.py line {arg.lineno}: session.install takes a non-literal argument; "
                        "write requirements as string literals so the audit can read them"
                    )
                i += 1
        if lines:
            reqs = _install_lines(root, repo, lines, f"noxfile.py session {node.name}")
            repo.roots.append(Root(f"noxfile.py [session {node.name}]", tuple(reqs)))


# ---------------------------------------------------------------------------
# Third-party metadata providers: the committed lock (offline) or PyPI (refresh).
# ---------------------------------------------------------------------------


class Provider(Protocol):
    """Resolves a requirement edge to a version per Python and returns that version's Requires-Dist."""

    def resolve(self, name: str, specifier: str, python: str) -> str | None:
        """Return the version an edge resolves to on ``python``, or None when nothing installs there."""
        ...

    def requires(self, name: str, version: str) -> tuple[str, ...]:
        """Return the Requires-Dist strings of ``name==version``."""
        ...


@dataclasses.dataclass
class LockProvider:
    """Reads the committed lock; any gap means the lock is stale."""

    data: Mapping[str, Any]

    def resolve(self, name: str, specifier: str, python: str) -> str | None:
        """Look the edge up in the lock's resolutions."""
        try:
            return self.data["resolutions"][name][specifier or "*"][python]  # type: ignore[no-any-return]
        except KeyError:
            raise StaleLock(
                f"the lock has no resolution for {name}{specifier} on Python {python}; {REFRESH_HINT}"
            ) from None

    def requires(self, name: str, version: str) -> tuple[str, ...]:
        """Look the version's Requires-Dist up in the lock."""
        try:
            return tuple(self.data["distributions"][name][version]["requires_dist"])
        except KeyError:
            raise StaleLock(f"the lock has no metadata for {name} {version}; {REFRESH_HINT}") from None


class PyPIProvider:
    """Resolves against PyPI (JSON simple API, PEP 691) and reads wheel METADATA (PEP 658); records a lock."""

    def __init__(self, index: str = "https://pypi.org", floors: Mapping[str, str] | None = None) -> None:
        """Prepare an empty recording; ``floors`` maps a series to its lowest audited release (default X.Y.0).

        ``packaging`` is needed for PEP 440 version selection.
        """
        try:
            # Imported here: only --refresh needs PEP 440 resolution; the audit stays stdlib-only.
            from packaging.specifiers import SpecifierSet  # noqa: PLC0415
            from packaging.version import InvalidVersion, Version  # noqa: PLC0415
        except ImportError as exc:
            raise AuditError("--refresh needs the `packaging` distribution: pip install packaging") from exc
        self._specset = SpecifierSet
        self._version = Version
        self._invalid = InvalidVersion
        self.index = index.rstrip("/")
        self._floors = dict(floors or {})
        self._releases_cache: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.resolutions: dict[str, dict[str, dict[str, str | None]]] = {}
        self.distributions: dict[str, dict[str, dict[str, Any]]] = {}

    def _get(self, url: str, accept: str | None = None) -> bytes:
        req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        last: Exception | None = None
        for _ in range(3):
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return resp.read()  # type: ignore[no-any-return]
            except OSError as exc:
                last = exc
        raise AuditError(f"cannot fetch {url}: {last}")

    def _releases(self, name: str) -> dict[str, list[dict[str, Any]]]:
        if name not in self._releases_cache:
            body = self._get(f"{self.index}/simple/{name}/", "application/vnd.pypi.simple.v1+json")
            files_by_version: dict[str, list[dict[str, Any]]] = {}
            for f in json.loads(body)["files"]:
                if f.get("yanked"):
                    continue
                version = _version_from_filename(name, f["filename"])
                if version is not None:
                    files_by_version.setdefault(version, []).append(f)
            self._releases_cache[name] = files_by_version
        return self._releases_cache[name]

    def _admits(self, requires_python: str | None, python: str) -> bool:
        if not requires_python:
            return True
        try:
            spec = self._specset(requires_python)
        except ValueError:
            return True  # an unreadable Requires-Python restricts nothing we can prove
        floor = self._floors.get(python, f"{python}.0")
        return any(v in spec for v in (floor, f"{python}.{HIGH_PATCH}"))

    def resolve(self, name: str, specifier: str, python: str) -> str | None:
        """Pick the newest non-yanked release matching ``specifier`` that installs on ``python``."""
        key = specifier or "*"
        cached = self.resolutions.get(name, {}).get(key, {})
        if python in cached:
            return cached[python]
        spec = self._specset(specifier)
        candidates = []
        for text, files in self._releases(name).items():
            try:
                version = self._version(text)
            except self._invalid:
                continue
            # A release counts for a series when some audited patch release of it
            # installs it (Requires-Python ">=3.11.5" still serves 3.11; "<3.11.3"
            # does not when the policy audits 3.11 from 3.11.3).
            py_ok = any(self._admits(f.get("requires-python"), python) for f in files)
            if py_ok:
                candidates.append(version)
        chosen = max(spec.filter(candidates), default=None)
        result = str(chosen) if chosen is not None else None
        if result is not None:
            # Keep the exact spelling used by the index so metadata lookups match.
            result = next(t for t in self._releases(name) if _safe_eq(self._version, t, chosen))
        self.resolutions.setdefault(name, {}).setdefault(key, {})[python] = result
        return result

    def requires(self, name: str, version: str) -> tuple[str, ...]:
        """Fetch Requires-Dist of ``name==version`` and record it in the lock."""
        known = self.distributions.get(name, {}).get(version)
        if known is None:
            requires, rp = self._metadata(name, version)
            known = {"requires_python": rp, "requires_dist": sorted(requires)}
            self.distributions.setdefault(name, {})[version] = known
        return tuple(known["requires_dist"])

    def _metadata(self, name: str, version: str) -> tuple[list[str], str]:
        """Read the metadata a wheel of this release actually carries.

        Order: a wheel's PEP 658 ``.metadata`` file; else the METADATA inside a
        wheel (pure wheel first, then the smallest), read with HTTP range
        requests when the index gives sizes. The JSON API is used only for a
        release without wheels: its ``requires_dist`` comes from whichever file
        was uploaded first and can disagree with the wheels (psycopg 3.3.9's
        JSON names psycopg-binary==3.3.6 while its wheels require ==3.3.9).
        A release whose dependencies cannot be read fails closed.
        """
        files = self._releases(name).get(version, [])
        wheels = sorted(
            (f for f in files if f["filename"].endswith(".whl")),
            key=lambda f: (not f["filename"].endswith("-none-any.whl"), f.get("size") or 0, f["filename"]),
        )
        for f in wheels:
            if f.get("core-metadata") or f.get("data-dist-info-metadata"):
                return _parse_metadata(self._get(f["url"] + ".metadata").decode("utf-8", "replace"))
        if wheels:
            f = wheels[0]
            size = f.get("size")
            source: Any = _RangeFile(self, f["url"], int(size)) if size else io.BytesIO(self._get(f["url"]))
            with zipfile.ZipFile(source) as wheel:
                meta = [
                    n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
                ]
                if len(meta) != 1:
                    raise AuditError(
                        f"{f['filename']} has {len(meta)} METADATA files; cannot read its dependencies"
                    )
                return _parse_metadata(wheel.read(meta[0]).decode("utf-8", "replace"))
        try:
            info = json.loads(self._get(f"{self.index}/pypi/{name}/{version}/json"))["info"]
        except AuditError:
            info = {}
        if info.get("version") == version and info.get("requires_dist") is not None:
            return list(info["requires_dist"]), str(info.get("requires_python") or "")
        raise AuditError(
            f"{name} {version} ships no wheel and the index does not state its dependencies; the audit "
            "cannot see its graph, so it cannot be admitted as is"
        )

    def get_range(self, url: str, start: int, end: int) -> tuple[bytes, bool]:
        """Fetch bytes ``start..end`` (inclusive); the flag is False when the server sent the whole file."""
        req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})
        last: Exception | None = None
        for _ in range(3):
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return resp.read(), resp.status == 206
            except OSError as exc:
                last = exc
        raise AuditError(f"cannot fetch {url} bytes {start}-{end}: {last}")


class _RangeFile:
    """A read-only, seekable view of a remote file that fetches only the byte ranges read.

    zipfile reads the end-of-central-directory record and the central
    directory from the tail, then one member; for a wheel that is two or three
    small requests instead of the whole file (ruff's and mypy's wheels are
    over 10 MB). A server that ignores Range gets the whole body once.
    """

    _TAIL = 1 << 16

    def __init__(self, provider: PyPIProvider, url: str, size: int) -> None:
        """Prepare a view of ``size`` bytes at ``url``; nothing is fetched yet."""
        self._provider = provider
        self._url = url
        self._size = size
        self._pos = 0
        self._chunks: dict[int, bytes] = {}

    def seekable(self) -> bool:
        """Always seekable."""
        return True

    def tell(self) -> int:
        """Current offset."""
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move like a file object."""
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + offset))
        return self._pos

    def read(self, n: int = -1) -> bytes:
        """Read ``n`` bytes (or to the end) from the current offset."""
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._cached(self._pos, end)
        if data is None:
            start = min(self._pos, max(0, self._size - self._TAIL)) if end == self._size else self._pos
            body, partial = self._provider.get_range(self._url, start, end - 1)
            if not partial:
                start, self._chunks = 0, {}
            self._chunks[start] = body
            data = self._cached(self._pos, end)
            if data is None:
                raise AuditError(f"{self._url}: short read at {self._pos}-{end}")
        self._pos = end
        return data

    def _cached(self, start: int, end: int) -> bytes | None:
        for offset, body in self._chunks.items():
            if offset <= start and end <= offset + len(body):
                return body[start - offset : end - offset]
        return None


def _parse_metadata(text: str) -> tuple[list[str], str]:
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return [str(r) for r in msg.get_all("Requires-Dist") or []], str(msg.get("Requires-Python") or "")


def _safe_eq(version_cls: Any, text: str, other: Any) -> bool:
    try:
        return bool(version_cls(text) == other)
    except Exception:
        return False


def _version_from_filename(name: str, filename: str) -> str | None:
    """Extract the version from a wheel or sdist filename of project ``name``."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            # The sdist name part may contain dashes; match it canonically.
            for i in range(len(stem) - 1, 0, -1):
                if stem[i] == "-" and canonical_name(stem[:i]) == name:
                    return stem[i + 1 :]
            return None
    return None


# ---------------------------------------------------------------------------
# The walk.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hop:
    """One node of a printed path."""

    name: str
    version: str
    via: str  # the marker/extra annotation of the edge that reached this node ("" when unconditional)

    def render(self) -> str:
        """Render as ``name version [annotation]``."""
        return f"{self.name} {self.version}" + (f" [{self.via}]" if self.via else "")


@dataclasses.dataclass
class Finding:
    """A forbidden path: its root label, hops, and the targets on which it exists."""

    root: str
    hops: tuple[Hop, ...]
    targets: list[str]

    @property
    def key(self) -> str:
        """The ledger key: versioned names only, no annotations."""
        return ARROW.join([self.root, *(f"{h.name} {h.version}" for h in self.hops)])

    def render(self) -> str:
        """Render with annotations."""
        return ARROW.join([self.root, *(h.render() for h in self.hops)])


@dataclasses.dataclass
class WalkResult:
    """Everything the dependency walk learned."""

    findings: dict[str, Finding]
    reached: set[tuple[str, str]]
    problems: list[str]
    notes: set[str]
    comparators: set[str] = dataclasses.field(default_factory=set)  # admitted comparator paths, rendered


def _annotation(req: Requirement) -> str:
    parts = []
    if req.extras:
        parts.append("extras " + ",".join(sorted(req.extras)))
    if req.marker is not None:
        parts.append(str(req.marker))
    return "; ".join(parts)


def walk(repo: Repo, policy: Policy, provider: Provider, targets: Sequence[Target]) -> WalkResult:
    """Enumerate every path from every root to a banned distribution on every target."""
    result = WalkResult({}, set(), [], set())
    for target in targets:
        walker = _Walker(repo, policy, provider, result, target)
        for root in repo.roots:
            walker.root_label = root.label
            for req in root.requirements:
                walker.visit(req, root.extras, (), frozenset())
    return result


@dataclasses.dataclass
class _Walker:
    """Depth-first enumeration of paths on one target."""

    repo: Repo
    policy: Policy
    provider: Provider
    result: WalkResult
    target: Target
    root_label: str = ""
    # Nodes proven not to reach a banned distribution on this target. Only
    # subtrees explored without cutting a cycle are recorded, so a cut can never
    # hide a path that another root would reach.
    clean: set[str] = dataclasses.field(default_factory=set)

    def _where(self, hops: tuple[Hop, ...]) -> str:
        return ARROW.join([self.root_label, *(h.render() for h in hops)])

    def _children(
        self, req: Requirement, hops: tuple[Hop, ...]
    ) -> tuple[str, list[tuple[Requirement, frozenset[str]]]] | None:
        """Resolve ``req`` to a version and its outgoing edges, or None when it is not walked."""
        local = self.repo.dists.get(req.name)
        if local is not None:
            children = [(r, frozenset[str]()) for r in local.dependencies]
            for extra in sorted(req.extras):
                if extra not in local.optional:
                    self.result.problems.append(
                        f"{self._where(hops)}: requests extra {extra!r} of {local.name}, "
                        f"which {local.path}/pyproject.toml does not define"
                    )
                children.extend((r, frozenset[str]()) for r in local.optional.get(extra, ()))
            return local.version, children
        if req.name in self.policy.first_party:
            if self.repo.outside:
                self.result.notes.add(
                    f"{req.name} is Mayfly's own distribution (reached from {self.root_label}); "
                    "Mayfly's audit covers its graph, so it is not walked here"
                )
            else:
                self.result.notes.add(
                    f"{req.name} is first-party but not in the repository yet (reached from "
                    f"{self.root_label}); it is audited once its pyproject.toml lands"
                )
            return None
        version = self.provider.resolve(req.name, req.specifier, self.target.python)
        if version is None:
            return None
        edges = [(_parse_requirement(t), req.extras) for t in self.provider.requires(req.name, version)]
        return version, edges

    def _admitted_comparator(self, name: str, version: str, hops: tuple[Hop, ...]) -> bool:
        """Whether this banned node is its comparator, at its pinned version, required by its own session.

        Only there, and only directly: the same distribution reached from any
        other root, at another version, or through another requirement is a
        forbidden path like any banned one.
        """
        comparator = self.policy.comparators.get(name)
        return (
            comparator is not None
            and not self.repo.outside
            and not hops
            and self.root_label == comparator.root_label
            and version == comparator.version
        )

    def visit(
        self,
        req: Requirement,
        owner_extras: frozenset[str],
        hops: tuple[Hop, ...],
        on_path: frozenset[str],
    ) -> tuple[bool, bool]:
        """Visit one edge; return (reached a banned distribution, cut a cycle)."""
        if req.marker is not None and req.marker.evaluate(self.target.env, owner_extras) is False:
            return False, False
        if req.url is not None:
            self.result.problems.append(
                f"{self._where(hops)}{ARROW}{req.describe()}: "
                "a direct URL reference cannot be audited; depend on a released distribution"
            )
            return False, False
        resolved = self._children(req, hops)
        if resolved is None:
            return False, False
        version, children = resolved
        path = (*hops, Hop(req.name, version, _annotation(req)))
        self.result.reached.add((req.name, version))
        if req.name in self.policy.banned and self._admitted_comparator(req.name, version, hops):
            self.result.comparators.add(ARROW.join([self.root_label, *(h.render() for h in path)]))
        elif req.name in self.policy.banned:
            finding = Finding(self.root_label, path, [])
            existing = self.result.findings.setdefault(f"{finding.key}|{finding.render()}", finding)
            if self.target.label not in existing.targets:
                existing.targets.append(self.target.label)
            return True, False
        node_id = f"{req.name}=={version}[{','.join(sorted(req.extras))}]"
        if node_id in on_path:
            return False, True
        if node_id in self.clean:
            return False, False
        found = cut = False
        for child, extras in children:
            f, c = self.visit(child, extras, path, on_path | {node_id})
            found, cut = found or f, cut or c
        if not found and not cut:
            self.clean.add(node_id)
        return found, cut


# ---------------------------------------------------------------------------
# Source scan.
# ---------------------------------------------------------------------------

_THREAD_CREATORS: Final = frozenset(
    {
        "threading.Thread",
        "threading.Timer",
        "_thread.start_new_thread",
        "_thread.start_new",
        "concurrent.futures.ThreadPoolExecutor",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.thread.ThreadPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
        "multiprocessing.Pool",
        "multiprocessing.pool.Pool",
        "multiprocessing.pool.ThreadPool",
        "multiprocessing.dummy.Pool",
        "multiprocessing.dummy.Process",
    }
)


@dataclasses.dataclass(frozen=True)
class SourceFinding:
    """One forbidden construct in our own source."""

    path: str
    line: int
    rule: str
    detail: str

    def render(self) -> str:
        """Render as ``path:line: rule: detail``."""
        return f"{self.path}:{self.line}: {self.rule}: {self.detail}"


class _Scanner(ast.NodeVisitor):
    def __init__(
        self, path: str, policy: Policy, may_thread: bool, comparator_modules: frozenset[str] = frozenset()
    ) -> None:
        self.path = path
        self.policy = policy
        self.may_thread = may_thread
        self.comparator_modules = comparator_modules  # banned modules this file may import (a comparator's)
        self.aliases: dict[str, str] = {}
        self.findings: list[SourceFinding] = []

    def _add(self, node: ast.AST, rule: str, detail: str) -> None:
        self.findings.append(SourceFinding(self.path, getattr(node, "lineno", 0), rule, detail))

    def _check_module(self, node: ast.AST, module: str) -> None:
        top = module.split(".", 1)[0]
        if top == "asyncio":
            self._add(node, "asyncio", f"imports {module}; the greenlet hub is the only scheduler")
        elif top in self.policy.banned_modules and top not in self.comparator_modules:
            self._add(
                node,
                "banned-module",
                f"imports {module} (distribution {self.policy.banned_modules[top]} is banned)",
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self._check_module(node, node.module)
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.generic_visit(node)

    def _qualname(self, expr: ast.expr) -> str | None:
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        head = self.aliases.get(expr.id, expr.id)
        return ".".join([head, *reversed(parts)])

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._add(node, "async", f"async def {node.name}; use plain functions on the hub")
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self._add(node, "async", "await expression")
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._add(node, "async", "async for")
        self.generic_visit(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self._add(node, "async", "async with")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            self._add(node.target, "async", "async comprehension")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self._qualname(node.func)
        if name in _THREAD_CREATORS and not self.may_thread:
            self._add(
                node, "thread", f"{name}(...) outside the substrate; blocking work crosses substrate.offload"
            )
        if name is not None and name.startswith("asyncio."):
            self._add(node, "asyncio", f"calls {name}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = self._qualname(base)
            if name in _THREAD_CREATORS and not self.may_thread:
                self._add(node, "thread", f"class {node.name} subclasses {name} outside the substrate")
        self.generic_visit(node)


_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def markdown_python_blocks(text: str) -> list[tuple[int, str]]:
    """Return ``(first_line_number, source)`` of every fenced block whose info string is ``python``."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip().split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        i += 1
        if info and info[0] in ("python", "py", "python3"):
            indent = len(m.group("indent"))
            blocks.append((start + 1, "\n".join(line[indent:] for line in body) + "\n"))
    return blocks


def scan_sources(root: Path, policy: Policy) -> tuple[list[SourceFinding], int]:
    """Scan our own Python and docs code blocks; return findings and the number of files read."""
    files: set[Path] = set()
    for pattern in policy.scan_roots:
        for hit in root.glob(pattern):
            if hit.is_file():
                files.add(hit)
            elif hit.is_dir():
                files.update(hit.rglob("*.py"))
                files.update(hit.rglob("*.md"))
    owners = [root / o for o in policy.thread_owners]
    ruled = [hit for pattern in policy.thread_rule_roots for hit in root.glob(pattern)]
    findings: list[SourceFinding] = []
    count = 0
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        if any(
            part.startswith(".") or part in ("__pycache__", "build", "dist", "_build")
            for part in path.relative_to(root).parts
        ):
            continue
        owned = any(path == o or o in path.parents or path == o.with_suffix(".py") for o in owners)
        shipped = any(path == r or r in path.parents for r in ruled)
        may_thread = owned or not shipped
        comparator_modules = frozenset(
            module
            for comparator in policy.comparators.values()
            if any((root / s) in path.parents for s in comparator.sources)
            for module, name in policy.banned_modules.items()
            if name == comparator.name
        )
        text = path.read_text(encoding="utf-8")
        count += 1
        if path.suffix == ".md":
            units = [(line, f"{rel}:{line}", src) for line, src in markdown_python_blocks(text)]
        else:
            units = [(1, rel, text)]
        for first_line, label, src in units:
            try:
                tree = ast.parse(src, filename=label)
            except SyntaxError as exc:
                findings.append(
                    SourceFinding(
                        rel, first_line + (exc.lineno or 1) - 1, "syntax", f"cannot parse: {exc.msg}"
                    )
                )
                continue
            scanner = _Scanner(rel, policy, may_thread, comparator_modules)
            scanner.visit(tree)
            for f in scanner.findings:
                findings.append(dataclasses.replace(f, line=f.line + first_line - 1))
    return findings, count


# ---------------------------------------------------------------------------
# Lock handling and reporting.
# ---------------------------------------------------------------------------


def repo_fingerprint(repo: Repo, policy: Policy) -> list[str]:
    """The repository's declared third-party requirements, as the lock records them.

    Where a requirement is declared does not matter to the lock (the same
    requirement resolves the same way from any root), so a new tox env or nox
    session that reuses known requirements needs no refresh; first-party
    requirements are read from the repository and never need one either.
    """
    first_party = set(repo.dists) | policy.first_party
    return sorted(
        {req.describe() for root in repo.roots for req in root.requirements if req.name not in first_party}
    )


def load_lock(path: Path, repo: Repo, policy: Policy) -> tuple[LockProvider, list[str]]:
    """Read the lock and prove it covers the repository; raise StaleLock otherwise.

    A requirement the lock does not know fails (exit 2, refresh). A lock that
    also knows requirements the repository no longer declares still covers
    it, so that is only a note: a lock refreshed while a colleague's new
    distribution was on disk must not fail everyone else's checkout.
    """
    if not path.is_file():
        raise StaleLock(f"no lock at {path}; {REFRESH_HINT}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StaleLock(f"{path} is not valid JSON ({exc}); {REFRESH_HINT}") from exc
    if data.get("format") != LOCK_FORMAT:
        raise StaleLock(f"{path} has format {data.get('format')!r}, expected {LOCK_FORMAT}; {REFRESH_HINT}")
    # Resolutions depend on the releases each one was chosen for (Requires-Python
    # is read at a series' floor), so a lock made for other targets is stale.
    # Compared as floors: a lock that says "3.12" was made for 3.12.0.
    try:
        made_for = _python_floors(data.get("python_versions"), path)
    except AuditError:
        made_for = None
    if made_for != policy.python_floors:
        raise StaleLock(
            f"{path} was refreshed for Python {data.get('python_versions')!r}, but the policy's "
            f"[targets] audit {list(policy.python_floors.values())!r}; {REFRESH_HINT}"
        )
    locked = set(data.get("repository_requirements", []))
    current = set(repo_fingerprint(repo, policy))
    added = sorted(current - locked)
    if added:
        shown = "; ".join(f"new: {a}" for a in added[:5])
        more = f"; and {len(added) - 5} more" if len(added) > 5 else ""
        raise StaleLock(
            f"the lock does not cover the repository's requirements ({shown}{more}); {REFRESH_HINT}"
        )
    removed = sorted(locked - current)
    notes = []
    if removed:
        notes.append(
            f"the lock also covers {len(removed)} requirement(s) the repository no longer declares "
            f"(e.g. {removed[0]}); --refresh prunes them"
        )
    return LockProvider(data), notes


def write_lock(path: Path, repo: Repo, policy: Policy, provider: PyPIProvider) -> None:
    """Write the refreshed lock deterministically (sorted keys, one trailing newline)."""
    data = {
        "format": LOCK_FORMAT,
        "generated_by": "python3 policy/check_runtime_dependencies.py --refresh",
        "python_versions": list(policy.python_floors.values()),
        "repository_requirements": repo_fingerprint(repo, policy),
        "resolutions": provider.resolutions,
        "distributions": provider.distributions,
    }
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _compress_targets(labels: Iterable[str], policy: Policy) -> str:
    labels = set(labels)
    if labels >= {t.label for t in policy.targets}:
        return "all targets"
    by_python: dict[str, list[str]] = {}
    for t in policy.targets:
        if t.label in labels:
            by_python.setdefault(t.python, []).append(f"{t.platform}/{t.machine}")
    return "; ".join(f"py{py}: {', '.join(v)}" for py, v in sorted(by_python.items()))


@dataclasses.dataclass
class Report:
    """The outcome of an audit run."""

    forbidden: list[Finding]
    ledgered: list[Finding]
    stale_ledger: list[str]
    problems: list[str]
    source: list[SourceFinding]
    notes: list[str]
    stats: dict[str, int]
    comparators: list[str] = dataclasses.field(default_factory=list)  # admitted comparator paths

    @property
    def failed(self) -> bool:
        """True when anything must block a merge."""
        return bool(self.forbidden or self.stale_ledger or self.problems or self.source)


def audit(root: Path, policy_path: Path | None = None, lock_path: Path | None = None) -> Report:
    """Run the full offline audit of the repository at ``root``."""
    policy = Policy.load(policy_path or root / POLICY_FILE)
    repo = load_repo(root, policy)
    provider, lock_notes = load_lock(lock_path or root / LOCK_FILE, repo, policy)
    walked = walk(repo, policy, provider, policy.targets)
    forbidden: list[Finding] = []
    ledgered: list[Finding] = []
    seen_keys = set()
    for finding in sorted(walked.findings.values(), key=lambda f: (f.key, f.render())):
        seen_keys.add(finding.key)
        (ledgered if finding.key in policy.ledger else forbidden).append(finding)
    stale = sorted(k for k in policy.ledger if k not in seen_keys)
    problems = set(walked.problems) | set(_stale_comparators(repo, policy, walked))
    source, nfiles = scan_sources(root, policy)
    stats = {
        "roots": len(repo.roots),
        "targets": len(policy.targets),
        "distributions": len(walked.reached),
        "source_files": nfiles,
    }
    return Report(
        forbidden,
        ledgered,
        stale,
        sorted(problems),
        source,
        sorted(walked.notes | set(repo.notes) | set(lock_notes)),
        stats,
        sorted(walked.comparators),
    )


def _stale_comparators(repo: Repo, policy: Policy, walked: WalkResult) -> list[str]:
    """A comparator whose session is gone, or no longer installs it at its version, is a stale entry."""
    problems = []
    labels = {root.label for root in repo.roots}
    for comparator in policy.comparators.values():
        prefix = f"{comparator.root_label}{ARROW}{comparator.name} {comparator.version}"
        if comparator.root_label not in labels:
            problems.append(
                f"STALE COMPARATOR {comparator.name}: noxfile.py has no session {comparator.session} "
                f"that installs anything; delete the [[comparator]] entry from {POLICY_FILE} "
                "or restore the session"
            )
        elif not any(path == prefix or path.startswith(f"{prefix} [") for path in walked.comparators):
            problems.append(
                f"STALE COMPARATOR {comparator.name}: nox session {comparator.session} does not install "
                f"{comparator.name}=={comparator.version}; pin it there or update the entry in {POLICY_FILE}"
            )
    return problems


def print_report(report: Report, policy: Policy, out: Any = None) -> None:
    """Print the human-readable report (to stdout unless ``out`` is given)."""
    out = out or sys.stdout
    for f in report.forbidden:
        print(f"FORBIDDEN {f.render()}  (on {_compress_targets(f.targets, policy)})", file=out)
        print(f"    {f.hops[-1].name} is banned: {policy.banned[f.hops[-1].name]}", file=out)
        comparator = policy.comparators.get(f.hops[-1].name)
        if comparator is not None:
            print(
                f"    {comparator.name} is a benchmark comparator: admitted only as "
                f"{comparator.name}=={comparator.version}, required directly by nox session "
                f"{comparator.session}, whose venv no Mayfly env shares",
                file=out,
            )
    for path in report.comparators:
        print(f"comparator {path}  (benchmark comparator: this nox session's venv only)", file=out)
    for f in report.ledgered:
        print(f"ledgered  {f.render()}  ({policy.ledger[f.key]})", file=out)
    for key in report.stale_ledger:
        print(
            f"STALE LEDGER ENTRY {key!r}: no such path exists any more; delete it from {POLICY_FILE}",
            file=out,
        )
    for p in report.problems:
        print(f"PROBLEM {p}", file=out)
    for finding in report.source:
        print(f"SOURCE {finding.render()}", file=out)
    for n in report.notes:
        print(f"note: {n}", file=out)
    s = report.stats
    verdict = "FAILED" if report.failed else "clean"
    print(
        f"runtime-dependency audit {verdict}: {s['roots']} roots x {s['targets']} targets, "
        f"{s['distributions']} distribution versions reached, {len(report.forbidden)} forbidden path(s), "
        f"ledger {len(policy.ledger)} entr{'y' if len(policy.ledger) == 1 else 'ies'} "
        f"({len(report.stale_ledger)} stale), "
        f"{s['source_files']} source files scanned, {len(report.source)} source finding(s)",
        file=out,
    )


def report_json(report: Report) -> str:
    """Render the report as JSON."""
    return json.dumps(
        {
            "failed": report.failed,
            "forbidden": [{"path": f.render(), "key": f.key, "targets": f.targets} for f in report.forbidden],
            "ledgered": [f.key for f in report.ledgered],
            "stale_ledger": report.stale_ledger,
            "problems": report.problems,
            "source": [dataclasses.asdict(s) for s in report.source],
            "notes": report.notes,
            "stats": report.stats,
            "comparators": report.comparators,
        },
        indent=1,
        sort_keys=True,
    )


def refresh(
    root: Path,
    policy_path: Path | None = None,
    lock_path: Path | None = None,
    index: str = "https://pypi.org",
) -> int:
    """Rebuild the lock from the index by walking the graph on every target; return the distribution count."""
    policy = Policy.load(policy_path or root / POLICY_FILE)
    repo = load_repo(root, policy)
    provider = PyPIProvider(index, policy.python_floors)
    walk(repo, policy, provider, policy.targets)
    write_lock(lock_path or root / LOCK_FILE, repo, policy, provider)
    return sum(len(v) for v in provider.distributions.values())


# ---------------------------------------------------------------------------
# Third-party mode: a distribution, wheel, project or requirements file from
# outside the repository, resolved against the running environment or an index.
# ---------------------------------------------------------------------------


class InstalledProvider:
    """Resolves every edge to what is installed in the running environment (offline)."""

    def __init__(self) -> None:
        self.missing: dict[str, str] = {}
        self.mismatched: dict[str, str] = {}

    def resolve(self, name: str, specifier: str, python: str) -> str | None:
        """The installed version of ``name``; None (recorded as missing) when it is not installed."""
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            self.missing.setdefault(name, specifier)
            return None
        if specifier and specifier_admits(specifier, version) is False:
            self.mismatched[name] = f"{name} {version} is installed but the graph asks for {name}{specifier}"
        return version

    def requires(self, name: str, version: str) -> tuple[str, ...]:
        """The installed distribution's Requires-Dist."""
        return tuple(importlib.metadata.distribution(name).requires or ())


def running_target() -> Target:
    """The target the running interpreter is: its Python release, platform and machine."""
    series = f"{sys.version_info.major}.{sys.version_info.minor}"
    implementation = sys.implementation.name
    env = {
        "python_version": series,
        FLOOR_VAR: platform.python_version(),
        "implementation_name": implementation,
        "platform_python_implementation": platform.python_implementation(),
        "sys_platform": sys.platform,
        "platform_system": platform.system(),
        "os_name": os.name,
        "platform_machine": platform.machine(),
    }
    return Target(series, sys.platform, platform.machine(), env)


@dataclasses.dataclass
class _Outside:
    """What the third-party targets declare: walk roots and the Python sources to scan."""

    repo: Repo
    sources: list[tuple[str, str, bool]]  # label, text, may create threads (tests and benchmarks)


_NOT_SHIPPED: Final = frozenset({"tests", "test", "benchmarks", "docs", "examples"})
_SKIPPED_DIRS: Final = frozenset({"__pycache__", "build", "dist", "node_modules", "site-packages"})


def _metadata_roots(text: str) -> tuple[str, list[Root]]:
    """The name and walk roots of a METADATA file: its requirements, once per extra."""
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    name, version = str(msg.get("Name") or "?"), str(msg.get("Version") or "?")
    requirements = tuple(Requirement.parse(str(r)) for r in msg.get_all("Requires-Dist") or [])
    label = f"{canonical_name(name)} {version}"
    roots = [Root(label, requirements)]
    for extra in sorted({canonical_name(str(e)) for e in msg.get_all("Provides-Extra") or []}):
        roots.append(Root(f"{label} [extra {extra}]", requirements, frozenset({extra})))
    return label, roots


def _add_wheel(path: Path, outside: _Outside) -> None:
    try:
        wheel = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise AuditError(f"cannot read wheel {path}: {exc}") from exc
    with wheel:
        meta = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(meta) != 1:
            raise AuditError(f"{path.name} has {len(meta)} METADATA files; cannot read its dependencies")
        _, roots = _metadata_roots(wheel.read(meta[0]).decode("utf-8", "replace"))
        outside.repo.roots.extend(roots)
        for member in sorted(wheel.namelist()):
            if member.endswith(".py"):
                text = wheel.read(member).decode("utf-8", "replace")
                outside.sources.append((f"{path.name}/{member}", text, False))


def _add_installed(name: str, outside: _Outside) -> None:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise AuditError(
            f"{name!r} is neither a wheel, a project directory, a requirements file nor an installed "
            "distribution"
        ) from None
    label, roots = _metadata_roots(dist.read_text("METADATA") or "")
    outside.repo.roots.extend(roots)
    found = 0
    for file in dist.files or ():
        if file.suffix == ".py":
            located = Path(str(dist.locate_file(file)))
            if located.is_file():
                outside.sources.append((file.as_posix(), located.read_text("utf-8", "replace"), False))
                found += 1
    if not found:
        outside.repo.notes.append(
            f"{label} lists no Python files of its own (an editable install?): audit its wheel or its "
            "project directory to scan its source"
        )


def _add_project(path: Path, policy: Policy, outside: _Outside) -> None:
    project = load_repo(path, dataclasses.replace(policy, tooling=()))  # Mayfly's own tooling is not theirs
    outside.repo.dists.update(project.dists)
    outside.repo.by_path.update(project.by_path)
    outside.repo.roots.extend(project.roots)
    outside.repo.notes.extend(project.notes)
    for file in sorted(path.rglob("*.py")):
        parts = file.relative_to(path).parts
        if any(part.startswith(".") or part in _SKIPPED_DIRS for part in parts):
            continue
        text = file.read_text(encoding="utf-8", errors="replace")
        outside.sources.append((file.relative_to(path).as_posix(), text, bool(_NOT_SHIPPED & set(parts))))


def _add_requirements(path: Path, outside: _Outside) -> None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AuditError(f"cannot read requirements file {path}: {exc}") from exc
    reqs = _install_lines(path.parent, outside.repo, lines, path.name)
    outside.repo.roots.append(Root(f"requirements {path.name}", tuple(reqs)))


def _scan_texts(sources: Iterable[tuple[str, str, bool]], policy: Policy) -> list[SourceFinding]:
    findings: list[SourceFinding] = []
    for label, text, may_thread in sources:
        try:
            tree = ast.parse(text, filename=label)
        except SyntaxError as exc:
            findings.append(SourceFinding(label, exc.lineno or 1, "syntax", f"cannot parse: {exc.msg}"))
            continue
        scanner = _Scanner(label, policy, may_thread)
        scanner.visit(tree)
        findings.extend(scanner.findings)
    return findings


def audit_outside(
    targets: Sequence[str],
    *,
    requirements: Sequence[Path] = (),
    policy_path: Path | None = None,
    resolve: str = "installed",
    index: str = "https://pypi.org",
) -> tuple[Report, Policy]:
    """Audit distributions that are not in this repository, without the repository's lock.

    ``targets`` are wheel files, project directories or installed distribution
    names; ``requirements`` are requirements files. With ``resolve="installed"``
    the graph is what the running environment has installed, on this
    interpreter and platform; with ``resolve="index"`` every edge is resolved
    against ``index`` on every target of the policy.
    """
    policy = Policy.load(policy_path or PACKAGED_POLICY)
    outside = _Outside(Repo({}, {}, [], [], outside=True), [])
    for target in targets:
        path = Path(target)
        if path.is_file() and path.suffix == ".whl":
            _add_wheel(path, outside)
        elif path.is_dir() and (path / "pyproject.toml").is_file():
            _add_project(path.resolve(), policy, outside)
        elif path.exists():
            raise AuditError(f"{target} is neither a wheel nor a directory holding pyproject.toml")
        else:
            _add_installed(target, outside)
    for file in requirements:
        _add_requirements(file, outside)
    if not outside.repo.roots:
        raise AuditError("nothing to audit: name a wheel, a project directory, a distribution or -r FILE")
    if resolve == "installed":
        walked, problems, notes, walked_targets = _walk_installed(outside.repo, policy)
    else:
        walked_targets = policy.targets
        walked = walk(outside.repo, policy, PyPIProvider(index, policy.python_floors), walked_targets)
        problems, notes = set(walked.problems), set(walked.notes)
    notes |= set(outside.repo.notes)
    findings = sorted(walked.findings.values(), key=lambda f: (f.key, f.render()))
    report = Report(
        forbidden=findings,
        ledgered=[],
        stale_ledger=[],
        problems=sorted(problems),
        source=_scan_texts(outside.sources, policy),
        notes=sorted(notes),
        stats={
            "roots": len(outside.repo.roots),
            "targets": len(walked_targets),
            "distributions": len(walked.reached),
            "source_files": len(outside.sources),
        },
    )
    return report, dataclasses.replace(policy, targets=tuple(walked_targets))


def _walk_installed(repo: Repo, policy: Policy) -> tuple[WalkResult, set[str], set[str], tuple[Target, ...]]:
    """Walk against the running environment; a missing runtime requirement is a problem.

    Build requirements and dependency groups are installed by tools in
    environments of their own, rarely in the one audited here: one of them
    missing is a note pointing at ``--resolve index``, which walks them too.
    """
    target = running_target()
    tooling = [
        root for root in repo.roots if root.label.endswith("[build-system]") or "[group " in root.label
    ]
    runtime = [root for root in repo.roots if root not in tooling]
    problems: set[str] = set()
    notes: set[str] = {f"resolved against this environment only ({target.label})"}
    walked = WalkResult({}, set(), [], set())
    for roots, missing_is_problem in ((runtime, True), (tooling, False)):
        provider = InstalledProvider()
        part = walk(dataclasses.replace(repo, roots=roots), policy, provider, (target,))
        walked.findings.update(part.findings)
        walked.reached |= part.reached
        problems.update(part.problems)
        notes |= part.notes | set(provider.mismatched.values())
        for name, specifier in sorted(provider.missing.items()):
            if missing_is_problem:
                problems.add(
                    f"{name}{specifier} is required but not installed here, so its graph is unseen; install "
                    "the target with its extras first, or audit with --resolve index"
                )
            else:
                notes.add(
                    f"{name}{specifier} (a build or group requirement) is not installed here: not walked"
                )
    return walked, problems, notes, (target,)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="check_runtime_dependencies.py",
        description="Audit every dependency path and our own sources against the Mayfly "
        "runtime-dependency policy (ADR-0033). With TARGETs (or -r), audit those distributions "
        "from outside the Mayfly repository instead.",
    )
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="a wheel, a project directory or an installed distribution to audit (third-party mode)",
    )
    parser.add_argument(
        "-r",
        "--requirements",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a requirements file to audit (third-party mode; repeatable)",
    )
    parser.add_argument(
        "--resolve",
        choices=("installed", "index"),
        default="installed",
        help="third-party mode: resolve against this environment (offline) or against --index on every "
        "target (needs network and packaging)",
    )
    parser.add_argument(
        "--all-targets",
        action="store_true",
        help="audit every target (the default already does; accepted for ADR-0033 parity)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="rebuild policy/dependency-graph.lock.json from PyPI (needs network and packaging)",
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="repository root (default: the parent of policy/)"
    )
    parser.add_argument(
        "--policy", type=Path, default=None, help=f"policy file (default: ROOT/{POLICY_FILE})"
    )
    parser.add_argument("--lock", type=Path, default=None, help=f"lock file (default: ROOT/{LOCK_FILE})")
    parser.add_argument(
        "--index",
        default=os.environ.get("MAYFLY_AUDIT_INDEX", "https://pypi.org"),
        help="package index for --refresh and --resolve index",
    )
    args = parser.parse_args(argv)
    if args.targets or args.requirements:
        return _main_outside(args)
    root: Path = args.root or DEFAULT_ROOT
    root = root.resolve()
    try:
        if args.refresh:
            count = refresh(root, args.policy, args.lock, args.index)
            sys.stdout.write(
                f"lock refreshed: {count} third-party distribution versions recorded in "
                f"{args.lock or root / LOCK_FILE}\n"
            )
        report = audit(root, args.policy, args.lock)
    except StaleLock as exc:
        sys.stderr.write(f"stale lock: {exc}\n")
        return EXIT_USAGE
    except AuditError as exc:
        sys.stderr.write(f"audit error: {exc}\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(report_json(report) + "\n")
    else:
        print_report(report, Policy.load(args.policy or root / POLICY_FILE))
    return EXIT_VIOLATIONS if report.failed else EXIT_CLEAN


def _main_outside(args: argparse.Namespace) -> int:
    """Third-party mode of :func:`main`."""
    try:
        report, policy = audit_outside(
            args.targets,
            requirements=args.requirements,
            policy_path=args.policy,
            resolve=args.resolve,
            index=args.index,
        )
    except AuditError as exc:
        sys.stderr.write(f"audit error: {exc}\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(report_json(report) + "\n")
    else:
        print_report(report, policy)
    return EXIT_VIOLATIONS if report.failed else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
