"""Optional journal features are declared capabilities with Protocols; a method alone never counts."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from mayfly.errors import CompatibilityError
from mayfly.journal import (
    NETWORK,
    OPTIONAL_FEATURES,
    RUN_PURGE,
    RUN_SUMMARIES,
    RUN_VERIFICATION,
    Durability,
    Feature,
    JournalCapabilities,
    RunSummary,
)
from mayfly.local import LocalWorkflowJournal


class _Declares:
    """A journal-shaped object: what it declares, and whatever methods it happens to have."""

    url = "probe://"

    def __init__(self, capabilities: JournalCapabilities) -> None:
        self.capabilities = capabilities

    def run_summaries(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        updated_before: datetime.datetime | None = None,
        limit: int = 100,
    ) -> list[RunSummary]:
        """A method with the feature's name and signature."""
        return []


def test_a_method_without_the_declaration_is_not_the_feature() -> None:
    """A journal that has run_summaries but declares it absent is not served as RunSummaries."""
    journal = _Declares(JournalCapabilities.declare(Durability.MEMORY))
    assert RUN_SUMMARIES.of(journal) is None  # type: ignore[arg-type]  # journal-shaped on purpose
    assert not RUN_SUMMARIES.declared(journal)  # type: ignore[arg-type]


def test_a_declaration_without_the_protocol_is_a_compatibility_error() -> None:
    """Declaring a feature the journal does not implement raises CompatibilityError naming both."""
    journal = _Declares(JournalCapabilities.declare(Durability.MEMORY, "run_purge"))
    with pytest.raises(CompatibilityError, match=r"declares run_purge=True but does not implement RunPurge"):
        RUN_PURGE.of(journal)  # type: ignore[arg-type]  # journal-shaped on purpose
    declared = _Declares(JournalCapabilities.declare(Durability.MEMORY, "run_summaries"))
    assert RUN_SUMMARIES.of(declared) is declared  # type: ignore[arg-type]


def test_the_local_journal_declares_verification_and_purging(tmp_path: Path) -> None:
    """The file journal serves run verification and purging, and declares no index and no network."""
    with LocalWorkflowJournal(f"file://{tmp_path}/j") as journal:
        assert RUN_VERIFICATION.of(journal) is journal
        assert RUN_PURGE.of(journal) is journal
        assert RUN_SUMMARIES.of(journal) is None
        assert NETWORK.of(journal) is None


def test_every_feature_names_a_capability_flag() -> None:
    """Each optional feature is one JournalCapabilities flag; a feature of an unknown flag is refused."""
    assert {feature.flag for feature in OPTIONAL_FEATURES} == {
        "fault_injection",
        "run_summaries",
        "run_tails",
        "run_verification",
        "run_purge",
        "network",
    }
    with pytest.raises(ValueError, match="not a JournalCapabilities flag"):
        Feature("summaries", object)


def test_capabilities_are_declared_by_name() -> None:
    """declare() sets exactly the named flags, one per argument or several per argument; others are false."""
    declared = JournalCapabilities.declare(Durability.DURABLE, "cross_process fencing", "snapshots", "")
    assert declared == JournalCapabilities(
        durability=Durability.DURABLE,
        cross_process=True,
        fencing=True,
        crash_durable=False,
        snapshots=True,
    )
    with pytest.raises(ValueError, match=r"unknown capability flag.*fenced"):
        JournalCapabilities.declare(Durability.DURABLE, "fenced")
