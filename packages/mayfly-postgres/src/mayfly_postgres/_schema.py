"""Versioned schema migrations, applied under an advisory lock; every identifier quoted by ``psycopg.sql``.

Tables (all inside the configured schema):

``mayfly_migrations``  one row per applied migration version.
``runs``               per run: next sequence, fencing token, and inspection
                       columns (workflow id, status, created/updated time).
``records``            the journal: primary key (run id, sequence), unique
                       (run id, event id), payload as ``bytea``, checksum.
``snapshots``          at most one snapshot per run.
``leases``             per run: owner, fencing token, expiry on the server's
                       clock, and the grant's id (to resolve lost replies).
``run_index``          (migration 2) per run: the run index entry
                       (:mod:`mayfly.runindex`) workers claim runs from.
                       Derived data: a store upgraded from migration 1 has
                       no entries for its older runs until ``mayfly index
                       rebuild`` writes them from the histories.
``queues``             (migration 3) per queue with flow control: its
                       settings (:class:`mayfly.queues.QueueSettings`).
                       Migration 3 also gives ``run_index`` the columns
                       ``dedup_id`` (unique per queue among live runs) and
                       ``started_ms`` (the run's first claim), and creates
                       the claim function ``mayfly_claim`` (see
                       :data:`CLAIM_FUNCTION`). A store at migration 2
                       upgrades in place: its entries have no dedup id and
                       no recorded start (they count as never started).
``schedules``          (migration 4) per stored schedule: its definition
                       (:func:`mayfly.schedules.encode_schedule` bytes) and
                       the last tick a worker recorded starting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from mayfly.errors import CompatibilityError, JournalUnavailable
from mayfly_postgres._url import PostgresSettings

__all__ = ["LATEST_VERSION", "MIGRATIONS", "applied_version", "drop_schema", "ensure_schema", "migrate"]

# The claim (migration 3), a server-side function so that it stays one round trip and one transaction
# while counting what limits a queue in a snapshot taken *after* the queue's lock was granted.
#
# Under READ COMMITTED a statement's snapshot is taken when the statement starts, before any row lock
# it waits for: a single statement that locked a queue's settings row and then counted the queue's
# leases would count from before the claim it waited for committed, and both claims would fill the
# same slots. A VOLATILE PL/pgSQL function takes a fresh snapshot for each of its statements, so:
#
# 1. the settings rows of the limited queues (a concurrency or a rate limit) this claim may take runs
#    from (those with a claimable run) are locked FOR UPDATE, in name order (claimants never deadlock;
#    queue_set and queue_remove wait for the claim, which holds no other lock yet);
# 2. the claim statement, in a snapshot that sees every claim that held those locks before, computes
#    each queue's room (concurrency less its live leased runs, worker_concurrency less what the
#    claimant holds, and the claim's limit) and its starts left (rate_limit less the starts recorded
#    within the window), plans the runs of limited queues by those rules (mayfly.queues.plan_claim),
#    locks them with SKIP LOCKED, takes runs of queues without limits as the claim always did (in one
#    index scan, FOR UPDATE SKIP LOCKED, LIMIT), grants the leases, copies the fencing tokens, clears
#    wake flags and records the starts (started_ms) of runs claimed for the first time.
#
# A limited queue whose row was not locked in step 1 (its settings were created since) gets no room in
# step 2: its runs wait for the next claim. Claims of queues without settings lock nothing.
#
# Finding the candidates: every search is an index range that ends at the first entry that is not one, so
# a claim that finds nothing (every worker's idle poll) costs what the claimable and leased entries
# cost, never what the waiting ones do. A claimable root entry is one of three kinds, each searched on
# its own and then merged in claim order (priority DESC, ready_at NULLS LAST, run_id):
#
# (a) new or running: run_index_runnable (priority DESC, ready_at, run_id), in claim order, so a claim
#     of n stops after n unleased entries;
# (b) waiting and due: run_index_wake (ready_at) with ``ready_at <= now`` as the range's bound (the
#     timers an hour away are past its end), sorted in claim order;
# (c) waiting, woken and not due (so not found twice): run_index_woken, the few entries with wake set.
#
# A single index in claim order holding the waiting entries too (migration 2's run_index_claim) cannot
# bound the search by ``ready_at <= now``: its first column is the priority, so a claim that found
# fewer than n walked past every timer not yet due. Each search locks (FOR UPDATE SKIP LOCKED) at most
# n entries, and the merge keeps the first n: a claim may lock, for the length of its one statement,
# entries it does not take (as the limited queues' plan already did), which a concurrent claim then
# skips until its next poll; which runs a claim takes, and in which order, is as before. The limited
# queues' plan searches the same three kinds within each queue (run_index_queue_runnable, the range of
# run_index_wake up to now filtered by queue, run_index_woken), as does step 1's test for a claimable
# run; a queue's runs in progress are counted from the live leases (leases_expiry), not by walking the
# queue's waiting entries.
CLAIM_FUNCTION: Final = """
CREATE FUNCTION {schema}.mayfly_claim(
    p_owner text, p_limit bigint, p_ttl float8, p_now bigint, p_queues text[],
    p_held_names text[], p_held_counts bigint[]
) RETURNS TABLE (claimed_run text, claimed_token bigint, claimed_grant text)
LANGUAGE plpgsql VOLATILE
-- An OLTP statement whose estimates (an unanalysed queues table, generic plans) can pass jit_above_cost:
-- compiling it would cost seconds and save nothing.
SET jit = off
AS $claim$
DECLARE
    v_locked text[];
    v_clock timestamptz;
BEGIN
    SELECT coalesce(array_agg(l.name), '{{}}') INTO v_locked FROM (
        SELECT q.name FROM {schema}.queues q
        WHERE (q.concurrency IS NOT NULL OR q.rate_limit IS NOT NULL)
            AND (p_queues IS NULL OR q.name = ANY(p_queues))
            AND (EXISTS (SELECT FROM {schema}.run_index i
                    WHERE i.queue = q.name AND i.parent IS NULL AND i.status IN ('new', 'running')
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp()))
                OR EXISTS (SELECT FROM {schema}.run_index i
                    WHERE i.queue = q.name AND i.parent IS NULL AND i.status = 'waiting'
                    AND i.ready_at <= p_now
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp()))
                OR EXISTS (SELECT FROM {schema}.run_index i
                    WHERE i.wake AND i.queue = q.name AND i.parent IS NULL AND i.status = 'waiting'
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())))
        ORDER BY q.name FOR UPDATE OF q
    ) l;
    v_clock := clock_timestamp();
    RETURN QUERY
    WITH caps AS (
        SELECT q.name,
            CASE WHEN (q.concurrency IS NOT NULL OR q.rate_limit IS NOT NULL) AND q.name <> ALL(v_locked)
                THEN 0
            ELSE greatest(0, least(
                p_limit,
                -- The queue's runs in progress: the live leases (a range of leases_expiry: a volatile
                -- clock_timestamp() cannot bound an index scan, v_clock, read before, can), each one's
                -- entry by key, of the queue's live root runs.
                CASE WHEN q.concurrency IS NOT NULL THEN q.concurrency - (
                    SELECT count(*) FROM {schema}.leases l JOIN {schema}.run_index i ON i.run_id = l.run_id
                    WHERE l.expires_at > v_clock AND l.expires_at > clock_timestamp()
                    AND i.queue = q.name AND i.parent IS NULL AND i.status <> 'terminal') END,
                q.worker_concurrency - coalesce((SELECT h.n FROM unnest(p_held_names, p_held_counts)
                    AS h (name, n) WHERE h.name = q.name), 0)))
            END AS room,
            CASE WHEN q.rate_limit IS NULL THEN p_limit ELSE greatest(0, q.rate_limit - (
                SELECT count(*) FROM {schema}.run_index i
                WHERE i.queue = q.name AND i.started_ms IS NOT NULL
                AND i.started_ms > p_now - q.rate_period_ms AND i.parent IS NULL)) END AS starts
        FROM {schema}.queues q
        WHERE (q.concurrency IS NOT NULL OR q.worker_concurrency IS NOT NULL OR q.rate_limit IS NOT NULL)
            AND (p_queues IS NULL OR q.name = ANY(p_queues))
    ),
    -- The runs of queues without limits: (a), (b) and (c) of the comment above, each locked as found
    -- (a locking clause is not allowed in a UNION's arms, so each is a statement of its own). The queues
    -- with settings are one array, computed once: an anti-join with caps would hide (a)'s index order
    -- from the planner, which then sorted every runnable entry to take the first n.
    free_runnable AS (
        SELECT i.run_id, i.priority, i.ready_at, i.wake,
            i.status = 'new' AND i.started_ms IS NULL AS first_start
        FROM {schema}.run_index i
        WHERE i.parent IS NULL AND i.status IN ('new', 'running')
            AND (p_queues IS NULL OR i.queue = ANY(p_queues))
            AND i.queue <> ALL (ARRAY(SELECT c.name FROM caps c))
            AND NOT EXISTS (SELECT FROM {schema}.leases l
                WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
        ORDER BY i.priority DESC, i.ready_at, i.run_id LIMIT p_limit
        FOR UPDATE OF i SKIP LOCKED
    ),
    free_due AS (
        SELECT i.run_id, i.priority, i.ready_at, i.wake, false AS first_start
        FROM {schema}.run_index i
        WHERE i.parent IS NULL AND i.status = 'waiting' AND i.ready_at <= p_now
            AND (p_queues IS NULL OR i.queue = ANY(p_queues))
            AND i.queue <> ALL (ARRAY(SELECT c.name FROM caps c))
            AND NOT EXISTS (SELECT FROM {schema}.leases l
                WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
        ORDER BY i.priority DESC, i.ready_at, i.run_id LIMIT p_limit
        FOR UPDATE OF i SKIP LOCKED
    ),
    free_woken AS (
        SELECT i.run_id, i.priority, i.ready_at, i.wake, false AS first_start
        FROM {schema}.run_index i
        WHERE i.wake AND i.parent IS NULL AND i.status = 'waiting'
            AND NOT coalesce(i.ready_at <= p_now, false)
            AND (p_queues IS NULL OR i.queue = ANY(p_queues))
            AND i.queue <> ALL (ARRAY(SELECT c.name FROM caps c))
            AND NOT EXISTS (SELECT FROM {schema}.leases l
                WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
        ORDER BY i.priority DESC, i.ready_at NULLS LAST, i.run_id LIMIT p_limit
        FOR UPDATE OF i SKIP LOCKED
    ),
    planned AS (
        SELECT p.run_id FROM caps c CROSS JOIN LATERAL (
            SELECT u.run_id FROM (
                (SELECT i.run_id, i.priority, i.ready_at FROM {schema}.run_index i
                    WHERE i.queue = c.name AND i.parent IS NULL AND i.status = 'new' AND i.started_ms IS NULL
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
                    ORDER BY i.priority DESC, i.ready_at, i.run_id LIMIT least(c.starts, c.room))
                UNION ALL
                (SELECT i.run_id, i.priority, i.ready_at FROM {schema}.run_index i
                    WHERE i.queue = c.name AND i.parent IS NULL AND i.status IN ('new', 'running')
                    AND NOT (i.status = 'new' AND i.started_ms IS NULL)
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
                    ORDER BY i.priority DESC, i.ready_at, i.run_id LIMIT c.room)
                UNION ALL
                (SELECT i.run_id, i.priority, i.ready_at FROM {schema}.run_index i
                    WHERE i.queue = c.name AND i.parent IS NULL AND i.status = 'waiting'
                    AND i.ready_at <= p_now
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
                    ORDER BY i.priority DESC, i.ready_at, i.run_id LIMIT c.room)
                UNION ALL
                (SELECT i.run_id, i.priority, i.ready_at FROM {schema}.run_index i
                    WHERE i.wake AND i.queue = c.name AND i.parent IS NULL AND i.status = 'waiting'
                    AND NOT coalesce(i.ready_at <= p_now, false)
                    AND NOT EXISTS (SELECT FROM {schema}.leases l
                        WHERE l.run_id = i.run_id AND l.expires_at > clock_timestamp())
                    ORDER BY i.priority DESC, i.ready_at NULLS LAST, i.run_id LIMIT c.room)
            ) u ORDER BY u.priority DESC, u.ready_at NULLS LAST, u.run_id LIMIT c.room
        ) p WHERE c.room > 0
    ),
    -- The planned entries locked (by key, one by one), still claimable in their newest version.
    capped AS (
        SELECT c.* FROM planned p CROSS JOIN LATERAL (
            SELECT i.run_id, i.priority, i.ready_at, i.wake,
                i.status = 'new' AND i.started_ms IS NULL AS first_start
            FROM {schema}.run_index i
            WHERE i.run_id = p.run_id AND i.parent IS NULL
                AND (i.status IN ('new', 'running')
                    OR (i.status = 'waiting' AND (i.ready_at <= p_now OR i.wake)))
            FOR UPDATE OF i SKIP LOCKED
        ) c
    ),
    picked AS (
        SELECT * FROM free_runnable UNION ALL SELECT * FROM free_due
        UNION ALL SELECT * FROM free_woken UNION ALL SELECT * FROM capped
        ORDER BY priority DESC, ready_at NULLS LAST, run_id LIMIT p_limit
    ),
    granted AS (
        INSERT INTO {schema}.leases AS l (run_id, owner, token, grant_id, expires_at)
        SELECT picked.run_id, p_owner, 1, gen_random_uuid(),
            clock_timestamp() + p_ttl * interval '1 millisecond' FROM picked
        ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1,
            grant_id = EXCLUDED.grant_id, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= clock_timestamp() RETURNING l.run_id, l.token, l.grant_id
    ),
    fenced AS (
        INSERT INTO {schema}.runs AS r (run_id, fence) SELECT granted.run_id, granted.token FROM granted
        ON CONFLICT (run_id) DO UPDATE SET fence = greatest(r.fence, EXCLUDED.fence) RETURNING 1
    ),
    -- Clear the wake flags, record the starts: the granted entries that need it, updated by key.
    answered AS (
        UPDATE {schema}.run_index i SET wake = false, started_ms = CASE
            WHEN i.status = 'new' AND i.started_ms IS NULL THEN p_now ELSE i.started_ms END
        WHERE i.run_id = ANY (ARRAY(SELECT g.run_id FROM granted g JOIN picked p ON p.run_id = g.run_id
            WHERE p.wake OR p.first_start))
        RETURNING 1
    )
    SELECT g.run_id::text, g.token, g.grant_id::text FROM granted g JOIN picked p ON p.run_id = g.run_id
    ORDER BY p.priority DESC, p.ready_at NULLS LAST, g.run_id;
END
$claim$"""

# Each migration is a list of statements; {schema} is replaced by the quoted schema name.
MIGRATIONS: Final[Sequence[tuple[int, str, Sequence[str]]]] = (
    (
        1,
        "journal, snapshots, leases and run inspection columns",
        (
            """CREATE TABLE {schema}.runs (
                run_id uuid PRIMARY KEY,
                next_sequence bigint NOT NULL DEFAULT 1 CHECK (next_sequence >= 1),
                fence bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
                workflow_id text,
                status text,
                created_at timestamptz NOT NULL DEFAULT now(),
                updated_at timestamptz NOT NULL DEFAULT now()
            ) WITH (fillfactor = 70)""",
            """CREATE TABLE {schema}.records (
                run_id uuid NOT NULL,
                sequence bigint NOT NULL CHECK (sequence >= 1),
                event_id uuid NOT NULL,
                event_type text NOT NULL,
                schema_version bigint NOT NULL CHECK (schema_version >= 1),
                payload bytea NOT NULL,
                checksum text NOT NULL,
                PRIMARY KEY (run_id, sequence),
                UNIQUE (run_id, event_id)
            )""",
            """CREATE TABLE {schema}.snapshots (
                run_id uuid PRIMARY KEY,
                schema_version bigint NOT NULL,
                last_sequence bigint NOT NULL,
                last_event_id uuid NOT NULL,
                last_record_checksum text NOT NULL,
                spec_checksum text NOT NULL,
                state_checksum text NOT NULL,
                state bytea NOT NULL,
                checksum text NOT NULL,
                written_at timestamptz NOT NULL DEFAULT now()
            )""",
            """CREATE TABLE {schema}.leases (
                run_id uuid PRIMARY KEY,
                owner text NOT NULL,
                token bigint NOT NULL CHECK (token >= 1),
                grant_id uuid NOT NULL,
                expires_at timestamptz NOT NULL
            )""",
            "CREATE INDEX runs_status_updated ON {schema}.runs (status, updated_at DESC, run_id)",
            "CREATE INDEX runs_workflow_updated ON {schema}.runs (workflow_id, updated_at DESC, run_id)",
            "CREATE INDEX runs_updated ON {schema}.runs (updated_at DESC, run_id)",
        ),
    ),
    (
        2,
        "run index: per-run claim entries (status, wake time, wake flag, queue, parent, priority)",
        (
            """CREATE TABLE {schema}.run_index (
                run_id uuid PRIMARY KEY,
                queue text NOT NULL,
                status text NOT NULL CHECK (status IN ('new', 'running', 'waiting', 'terminal')),
                ready_at bigint,
                sequence bigint NOT NULL CHECK (sequence >= 0),
                wake boolean NOT NULL DEFAULT false,
                parent uuid,
                priority bigint NOT NULL DEFAULT 0
            ) WITH (fillfactor = 70)""",
            # The claim order over the entries that can ever be claimed: a root run that is runnable,
            # has a wake time, or was woken. Runs parked on a signal only enter it when woken.
            """CREATE INDEX run_index_claim ON {schema}.run_index (priority DESC, ready_at, run_id)
                WHERE parent IS NULL AND (status IN ('new', 'running')
                    OR (status = 'waiting' AND (ready_at IS NOT NULL OR wake)))""",
            """CREATE INDEX run_index_wake ON {schema}.run_index (ready_at)
                WHERE parent IS NULL AND status = 'waiting'""",
            # The few woken runs, so a claim clears their wake without scanning the table.
            "CREATE INDEX run_index_woken ON {schema}.run_index (run_id) WHERE wake",
        ),
    ),
    (
        3,
        "queue flow control: queue settings, dedup ids and recorded starts on entries, the claim function",
        (
            """CREATE TABLE {schema}.queues (
                name text PRIMARY KEY,
                concurrency integer CHECK (concurrency BETWEEN 1 AND 1000000),
                worker_concurrency integer CHECK (worker_concurrency BETWEEN 1 AND 1000000),
                rate_limit integer CHECK (rate_limit BETWEEN 1 AND 1000000),
                rate_period_ms bigint CHECK (rate_period_ms BETWEEN 1 AND 2592000000),
                priority boolean NOT NULL DEFAULT false,
                updated_at timestamptz NOT NULL DEFAULT now(),
                CHECK ((rate_limit IS NULL) = (rate_period_ms IS NULL))
            )""",
            "ALTER TABLE {schema}.run_index ADD COLUMN dedup_id text, ADD COLUMN started_ms bigint",
            # One live run per (queue, dedup id): the append that would create a second one fails here.
            """CREATE UNIQUE INDEX run_index_dedup ON {schema}.run_index (queue, dedup_id)
                WHERE dedup_id IS NOT NULL AND status <> 'terminal'""",
            # Starts per queue within a rate window.
            """CREATE INDEX run_index_started ON {schema}.run_index (queue, started_ms)
                WHERE started_ms IS NOT NULL""",
            # The claim's searches (see CLAIM_FUNCTION): the runnable root runs in claim order, and per
            # queue (for queues with limits) its runnable ones in claim order; the waiting ones are found
            # by run_index_wake (migration 2). Migration 2's run_index_claim, which held the waiting runs
            # in claim order too, goes: no claim reads it. No per-queue index of wake times: the planner,
            # with the generic plans of the claim function, chose a whole scan of one for the due search
            # (its Index Cond on ready_at alone) over run_index_wake's range.
            "DROP INDEX {schema}.run_index_claim",
            """CREATE INDEX run_index_runnable ON {schema}.run_index (priority DESC, ready_at, run_id)
                WHERE parent IS NULL AND status IN ('new', 'running')""",
            """CREATE INDEX run_index_queue_runnable ON {schema}.run_index
                (queue, priority DESC, ready_at, run_id)
                WHERE parent IS NULL AND status IN ('new', 'running')""",
            # The live leases, for counting a queue's runs in progress (released ones are at -infinity).
            "CREATE INDEX leases_expiry ON {schema}.leases (expires_at)",
            CLAIM_FUNCTION,
        ),
    ),
    (
        4,
        "stored schedules: definitions and last started ticks",
        (
            """CREATE TABLE {schema}.schedules (
                name text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.:-]{{0,127}}$'),
                definition bytea NOT NULL,
                last_tick_ms bigint CHECK (last_tick_ms >= 0)
            )""",
        ),
    ),
)
"""Every migration in order: (version, description, statements). Append only; never edit a released one."""

LATEST_VERSION: Final = MIGRATIONS[-1][0]
"""The schema version this distribution reads and writes."""


def _lock_key(schema: str) -> sql.Composed:
    # One advisory lock per schema: deployments sharing a database migrate independently.
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
        sql.Literal(f"mayfly-postgres:{schema}")
    )


def _statement(template: str, schema: str) -> sql.Composed:
    return sql.SQL(template).format(schema=sql.Identifier(schema))


def applied_version(connection: psycopg.Connection[tuple[Any, ...]], schema: str) -> int:
    """Return the highest applied migration of ``schema`` (0 when it holds no Mayfly tables)."""
    row = connection.execute(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_tables "
        "WHERE schemaname = %s AND tablename = 'mayfly_migrations')",
        (schema,),
    ).fetchone()
    if row is None or not row[0]:
        return 0
    version = connection.execute(
        _statement("SELECT COALESCE(max(version), 0) FROM {schema}.mayfly_migrations", schema)
    ).fetchone()
    return int(version[0]) if version else 0


def migrate(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> list[int]:
    """Apply every pending migration in one transaction under the schema's advisory lock.

    Returns the versions applied (empty when the schema was current). Safe to
    run from many processes at once: one applies, the others wait and find
    nothing to do.
    """
    schema = settings.schema
    applied: list[int] = []
    with connection.transaction():
        connection.execute(_lock_key(schema))
        connection.execute(_statement("CREATE SCHEMA IF NOT EXISTS {schema}", schema))
        connection.execute(
            _statement(
                "CREATE TABLE IF NOT EXISTS {schema}.mayfly_migrations ("
                "version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())",
                schema,
            )
        )
        current = applied_version(connection, schema)
        _check_not_newer(settings, current)
        for version, description, statements in MIGRATIONS:
            if version <= current:
                continue
            for template in statements:
                connection.execute(_statement(template, schema))
            connection.execute(
                _statement(
                    "INSERT INTO {schema}.mayfly_migrations (version, description) VALUES (%s, %s)", schema
                ),
                (version, description),
            )
            applied.append(version)
    return applied


def _check_not_newer(settings: PostgresSettings, current: int) -> None:
    if current > LATEST_VERSION:
        raise CompatibilityError(
            f"{settings.url}: schema {settings.schema} is at migration {current}, newer than the "
            f"{LATEST_VERSION} this mayfly-postgres knows; upgrade mayfly-postgres on this host"
        )


def ensure_schema(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> None:
    """Make sure the schema is current: migrate when ``migrate=auto``, else refuse a stale one."""
    current = applied_version(connection, settings.schema)
    _check_not_newer(settings, current)
    if current == LATEST_VERSION:
        return
    if settings.migrate == "never":
        raise JournalUnavailable(
            f"{settings.url}: schema {settings.schema} is at migration {current}, this mayfly-postgres "
            f"needs {LATEST_VERSION}; run `python -m mayfly_postgres migrate URL` as a role allowed DDL"
        )
    migrate(connection, settings)


def drop_schema(connection: psycopg.Connection[tuple[Any, ...]], settings: PostgresSettings) -> None:
    """Drop the schema and everything in it (tests and teardown; irreversible)."""
    with connection.transaction():
        connection.execute(_lock_key(settings.schema))
        connection.execute(_statement("DROP SCHEMA IF EXISTS {schema} CASCADE", settings.schema))
