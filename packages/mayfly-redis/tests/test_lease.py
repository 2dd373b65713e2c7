"""Redis recovery leases: a race across processes, fencing of a stale owner, retried grants, close."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from typing import TYPE_CHECKING

import pytest
import redis

from mayfly.identity import Uuid7IdSource
from mayfly.lease import LEASE_LISTING
from mayfly.model.errors import FencingRejected, LeaseHeld, LeaseLost
from mayfly_redis import RedisJournal, RedisLeaseStore, _scripts
from mayfly_redis._lease import _LISTING_BUDGET
from mayfly_redis.testing import RedisServer

if TYPE_CHECKING:
    from conftest import Records

CONTENDER = textwrap.dedent(
    """
    import json, sys
    from mayfly.model.errors import LeaseHeld
    from mayfly.plugins import open_leases

    url, run_id, name = sys.argv[1], sys.argv[2], sys.argv[3]
    leases = open_leases(url)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        guard = leases.acquire(run_id, name, 60_000)
    except LeaseHeld:
        print(json.dumps({"won": False}), flush=True)
    else:
        print(json.dumps({"won": True, "token": guard.fencing_token}), flush=True)
        sys.stdin.readline()
        guard.release()
    leases.close()
    """
)

CONTENDERS = 4


def test_lease_race_across_processes_has_one_winner_per_round(aof_server: RedisServer, run_id: str) -> None:
    """Four processes acquiring one run's lease at the same moment: exactly one wins, tokens increase."""
    tokens: list[int] = []
    for round_number in range(2):
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CONTENDER, aof_server.url, run_id, f"p{round_number}-{index}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for index in range(CONTENDERS)
        ]
        try:
            for child in children:
                assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            answers = []
            for child in children:
                assert child.stdout is not None
                answers.append(json.loads(child.stdout.readline()))
            winners = [answer for answer in answers if answer["won"]]
            assert len(winners) == 1, answers
            tokens.append(winners[0]["token"])
            winner = children[answers.index(winners[0])]
            assert winner.stdin is not None
            winner.stdin.write("release\n")
            winner.stdin.flush()
            for child in children:
                assert child.wait(timeout=30) == 0
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                child.communicate(timeout=30)
    assert tokens == sorted(set(tokens))


def test_stale_owner_is_fenced_inside_the_append_script(
    aof_server: RedisServer, run_id: str, records: Records
) -> None:
    """After expiry and takeover the old holder cannot renew, and its appends are FencingRejected."""
    with RedisLeaseStore(aof_server.url) as leases, RedisJournal(aof_server.url) as journal:
        old = leases.acquire(run_id, "old", 100)
        journal.append(run_id, 1, records.batch(run_id, 1), fence=old.fencing_token)
        time.sleep(0.3)
        new = leases.acquire(run_id, "new", 30_000)
        with pytest.raises(FencingRejected) as caught:
            journal.append(run_id, 2, records.batch(run_id, 2), fence=old.fencing_token)
        assert (caught.value.presented, caught.value.current) == (old.fencing_token, new.fencing_token)
        with pytest.raises(LeaseLost):
            old.renew()
        old.release()  # must not delete the new owner's lease
        with pytest.raises(LeaseHeld, match="new"):
            leases.acquire(run_id, "third", 30_000)
        new.release()


def test_expired_lease_cannot_be_renewed(aof_server: RedisServer, run_id: str) -> None:
    """A lease whose ttl ran out is lost even before anyone takes it over (fail closed)."""
    with RedisLeaseStore(aof_server.url) as leases:
        guard = leases.acquire(run_id, "slow", 50)
        time.sleep(0.2)
        with pytest.raises(LeaseLost):
            guard.renew()


def test_a_refused_acquire_says_when_the_lease_expires(aof_server: RedisServer, run_id: str) -> None:
    with RedisLeaseStore(aof_server.url) as leases, leases.acquire(run_id, "holder", 60_000):
        with pytest.raises(
            LeaseHeld, match=r"held by holder \(it expires in \d+\.\d s unless renewed\)"
        ) as held:
            leases.acquire(run_id, "other", 1_000)
        assert held.value.expires_in_ms is not None and 50_000 < held.value.expires_in_ms <= 60_000


def test_retried_acquire_gets_its_own_grant_back(aof_server: RedisServer, run_id: str) -> None:
    """An acquire re-sent with the same nonce (its reply was lost) returns the same token, not LeaseHeld."""
    with RedisLeaseStore(aof_server.url) as leases:
        redis_store = leases._redis
        keys = [redis_store.target.key(run_id, "lease"), redis_store.target.key(run_id, "fence")]
        first = redis_store.script("acquire", _scripts.ACQUIRE, keys, ["nonce-1", "owner", 30_000])
        again = redis_store.script("acquire", _scripts.ACQUIRE, keys, ["nonce-1", "owner", 30_000])
        other = redis_store.script("acquire", _scripts.ACQUIRE, keys, ["nonce-2", "other", 30_000])
        assert first == again == [b"granted", b"1"]
        assert other[:2] == [b"held", b"owner"] and 0 < other[2] <= 30_000  # and how long it has left
        assert leases.current_fence(run_id) == 1


def test_close_releases_held_leases(aof_server: RedisServer, run_id: str) -> None:
    """Closing a lease store releases what it still holds, so another store can acquire at once."""
    first = RedisLeaseStore(aof_server.url)
    first.acquire(run_id, "closing", 60_000)
    first.close()
    with RedisLeaseStore(aof_server.url) as second, second.acquire(run_id, "next", 60_000) as guard:
        assert guard.fencing_token == 2


def test_owner_with_spaces_is_reported_whole(aof_server: RedisServer, run_id: str) -> None:
    """LeaseHeld names the holder's full owner description, spaces included."""
    with RedisLeaseStore(aof_server.url) as leases, leases.acquire(run_id, "worker 7 on host a", 60_000):
        with pytest.raises(LeaseHeld) as caught:
            leases.acquire(run_id, "other", 60_000)
        assert caught.value.holder == "worker 7 on host a"


def test_the_listing_skips_expired_members_past_its_per_script_budget(aof_server: RedisServer) -> None:
    """Leases that expired unreleased stay in P:leases; the listing skips them over several bounded
    scripts, finds the live lease behind them, and removes nothing."""
    ids = Uuid7IdSource()
    url = f"{aof_server.url.partition('?')[0]}?prefix=listing{uuid.uuid4().hex[:8]}"
    with RedisLeaseStore(url) as leases:
        listing = LEASE_LISTING.of(leases)
        assert listing is not None
        stale = sorted(ids.new_id() for _ in range(_LISTING_BUDGET + 100))
        for run in stale:
            leases.acquire(run, "gone", 1)  # expires at once, never released
        live = ids.new_id()
        time.sleep(0.05)
        with leases.acquire(live, "live owner", 60_000) as guard:
            found = listing.list_leases()
            assert [(lease.run_id, lease.owner, lease.fencing_token) for lease in found] == [
                (live, "live owner", guard.fencing_token)
            ]
            client = redis.Redis(host="127.0.0.1", port=aof_server.port)
            try:
                assert client.zcard(f"{leases._redis.layout.prefix}:leases") == len(stale) + 1
            finally:
                client.close()
        assert listing.list_leases() == []


def test_a_lease_granted_before_the_listing_existed_is_listed_from_its_next_renewal(
    aof_server: RedisServer, run_id: str
) -> None:
    """A grant whose run is missing from P:leases (an older store) shows once the holder renews it."""
    with RedisLeaseStore(aof_server.url) as leases:
        listing = LEASE_LISTING.of(leases)
        assert listing is not None
        guard = leases.acquire(run_id, "old grant", 60_000)
        client = redis.Redis(host="127.0.0.1", port=aof_server.port)
        try:
            client.zrem(f"{leases._redis.layout.prefix}:leases", run_id)
        finally:
            client.close()
        assert run_id not in [lease.run_id for lease in listing.list_leases(limit=1000)]
        guard.renew()
        assert run_id in [lease.run_id for lease in listing.list_leases(limit=1000)]
        guard.release()
        assert run_id not in [lease.run_id for lease in listing.list_leases(limit=1000)]


def test_only_a_standalone_store_files_and_lists_leases() -> None:
    """The scripts a sharded Cluster store runs file no run in a lease set; the standalone ones do."""
    for script in (_scripts.CLAIM, _scripts.RELEASE, _scripts.PURGE):
        assert "':leases'" in script
        assert "':leases'" not in _scripts.for_layout(script, sharded=True)
