"""The server-side Lua scripts: compare-and-append and the lease operations.

Each script runs atomically on the server and touches only keys of one hash
tag: a run's on a standalone server's journal keys, a shard's on a sharded
Cluster store (:func:`for_layout`), so it works on Redis Cluster. Scripts are always
called by SHA; a ``NOSCRIPT`` reply (first use, server restarted, failover,
``SCRIPT FLUSH``) loads them (``SCRIPT LOAD``) and retries once.

Numbers cross the Lua boundary as decimal strings and are compared as strings
where precision matters: Lua numbers are doubles, fencing tokens are int64.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACQUIRE",
    "APPEND",
    "APPEND_INDEXED",
    "CLAIM",
    "INDEX_PUT",
    "INDEX_WAKE",
    "LIST_LEASES",
    "NEXT_WAKE",
    "PURGE",
    "QUEUE_SET",
    "QUEUE_USAGE",
    "READ",
    "RELEASE",
    "RENEW",
    "for_layout",
]

_CHECK_AND_APPEND: Final = """
-- KEYS: records list, ids hash, fence string [, runs index zset (standalone only)], then the
--       script's own keys
-- ARGV: fence ('' = none), expected_next, count, run_id, then the script's own arguments, then
--       from ARGV[E + 1] one list element per record
--       ('<seq>\\n<event_id>\\n<type>\\n<version>\\n<checksum>\\n<payload>'), exactly the
--       bytes stored; the event id and the identity '<seq> <checksum>' are read from it.
local E = @E@
local fence = redis.call('GET', KEYS[3]) or '0'
if (ARGV[1] == '' and fence ~= '0') or (ARGV[1] ~= '' and ARGV[1] ~= fence) then
  return {'fence', fence}
end
local length = redis.call('LLEN', KEYS[1])
if length > 0 then
  local tail = redis.call('LINDEX', KEYS[1], -1)
  local tail_sequence = string.match(tail, '^(%d+)\\n')
  if tail_sequence ~= tostring(length) then
    return {'corrupt', 'last record holds sequence ' .. tostring(tail_sequence) ..
      ' but the run holds ' .. tostring(length) .. ' records'}
  end
end
-- Every append adds one ids field per record, so the index counts the records ever appended: a
-- shorter list lost records (the end of it included), and nothing is appended after the loss.
local indexed = redis.call('HLEN', KEYS[2])
if indexed ~= length then
  return {'corrupt', 'the list holds ' .. tostring(length) .. ' records but ' .. tostring(indexed) ..
    ' were appended (its event-id index)'}
end
local actual = length + 1
local count = tonumber(ARGV[3])
local ids = {}
local identities = {}
for i = 1, count do
  local sequence, event_id, checksum =
    string.match(ARGV[E + i], '^(%d+)\\n([^\\n]+)\\n[^\\n]*\\n[^\\n]*\\n([^\\n]+)\\n')
  if not checksum then return {'corrupt', 'malformed element ' .. i .. ' in the append request'} end
  ids[i] = event_id
  identities[i] = sequence .. ' ' .. checksum
end
-- unpack() is bounded by Lua's C stack, so long batches go in chunks of 500.
local stored = {}
for first = 1, count, 500 do
  local found = redis.call('HMGET', KEYS[2], unpack(ids, first, math.min(first + 499, count)))
  for offset = 1, #found do stored[first + offset - 1] = found[offset] end
end
local replay = true
for i = 1, count do
  if stored[i] ~= identities[i] then replay = false end
end
if tostring(actual) ~= ARGV[2] then
  if replay then
    -- The index agrees; the stored elements must too, byte for byte, or the record is damaged.
    local first = tonumber(string.match(ARGV[E + 1], '^(%d+)\\n'))
    local elements = redis.call('LRANGE', KEYS[1], first - 1, first + count - 2)
    for i = 1, count do
      if elements[i] ~= ARGV[E + i] then return {'damaged', tostring(first + i - 1)} end
    end
    return {'replay'}
  end
  for i = 1, count do
    if stored[i] and stored[i] ~= identities[i] then return {'conflict', ids[i], stored[i]} end
  end
  return {'cas', tostring(actual)}
end
for i = 1, count do
  if stored[i] then return {'conflict', ids[i], stored[i]} end
end
@ACCEPTED@
for first = 1, count, 500 do
  local last = math.min(first + 499, count)
  local fields = {}
  for i = first, last do
    fields[#fields + 1] = ids[i]
    fields[#fields + 1] = identities[i]
  end
  redis.call('RPUSH', KEYS[1], unpack(ARGV, E + first, E + last))
  redis.call('HSET', KEYS[2], unpack(fields))
end
if actual == 1 and KEYS[4] then redis.call('ZADD', KEYS[4], 0, ARGV[4]) end
@WRITTEN@
"""


def _check_and_append(elements: int, accepted: str, written: str) -> str:
    """The compare-and-append script with its elements from ``ARGV[elements + 1]`` and two hooks.

    ``accepted`` runs once the batch can no longer be refused (before anything is written);
    ``written`` once it is written, and returns the reply.
    """
    return (
        _CHECK_AND_APPEND.replace("@E@", str(elements))
        .replace("@ACCEPTED@", accepted)
        .replace("@WRITTEN@", written)
    )


APPEND: Final = _check_and_append(4, "", "return {'ok', tostring(length + count)}")

READ: Final = """
-- KEYS: records list, ids hash; ARGV: LRANGE start, stop
-- One atomic reply: how many records were ever appended (the index) and the window.
return {redis.call('HLEN', KEYS[2]), redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])}
"""

ACQUIRE: Final = """
-- KEYS: lease string, fence string [, index hash (standalone only)]; ARGV: nonce, owner, ttl_ms
-- [, prefix, run id (standalone only)]. The lease value is '<token> <nonce> <owner>'. A retried
-- acquire whose reply was lost finds its own nonce and gets its grant back instead of LeaseHeld.
-- On a standalone server the run joins the lease listing's set, and a root run with a live entry in
-- a queue with settings joins its queue's holding set (it is in progress there: see mayfly_redis._index).
if redis.call('SET', KEYS[1], 'granting', 'NX', 'PX', ARGV[3]) then
  redis.call('INCR', KEYS[2])
  local token = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1] .. ' ' .. ARGV[2], 'KEEPTTL')
  if KEYS[3] then
    redis.call('ZADD', ARGV[4] .. ':leases', 0, ARGV[5])  -- the lease listing's set (see LIST_LEASES)
    local e = redis.call('HMGET', KEYS[3], 'q', 'p', 's')
    if e[1] and e[2] == '' and e[3] ~= 'terminal' and
        redis.call('HEXISTS', ARGV[4] .. ':queue-settings', e[1]) == 1 then
      local t = redis.call('TIME')
      local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
      redis.call('ZADD', ARGV[4] .. ':{q:' .. e[1] .. '}:holding', expiry, ARGV[5])
    end
  end
  return {'granted', token}
end
local holder = redis.call('GET', KEYS[1])
local token, nonce, owner = string.match(holder, '^(%d+) (%S+) (.*)$')
if nonce == ARGV[1] then return {'granted', token} end
return {'held', owner or holder, redis.call('PTTL', KEYS[1])}
"""

RENEW: Final = """
-- KEYS: lease string; ARGV: the exact lease value, ttl_ms [, prefix, run id (standalone only)].
-- On a standalone server a renewal (re)files the run in the lease listing's set, so a lease granted
-- before the set existed is listed from its next renewal on.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] then redis.call('ZADD', ARGV[3] .. ':leases', 0, ARGV[4]) end
  return 1
end
return 0
"""

LIST_LEASES: Final = """
-- KEYS: the lease listing's set P:leases (standalone only); ARGV: prefix, after ('' = from the first
-- run), limit, the most members to look at. Read only: a member whose lease expired or was released
-- without the set hearing of it is skipped, never removed. Replies the server's time (ms), 1 if the
-- members after the last one looked at are all seen, that last member, then run, lease value, ms
-- left for each live lease, in run id order.
local p, after, limit, budget = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local lower = '-'
if after ~= '' then lower = '(' .. after end
local members = redis.call('ZRANGEBYLEX', KEYS[1], lower, '+', 'LIMIT', 0, budget)
local t = redis.call('TIME')
local reply = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), 0, after}
if #members < budget then reply[2] = 1 end
local found = 0
for i, run in ipairs(members) do
  reply[3] = run
  local lease = p .. ':{' .. run .. '}:lease'
  local left = redis.call('PTTL', lease)
  if left > 0 then
    reply[#reply + 1] = run
    reply[#reply + 1] = redis.call('GET', lease)
    reply[#reply + 1] = left
    found = found + 1
    if found == limit then
      if i < #members then reply[2] = 0 end
      break
    end
  end
end
return reply
"""

# -- the run index (standalone servers; see mayfly_redis._index) ----------------------------------

_INDEX_LIB: Final = """
-- Keys are built here from the prefix P: a run's keys P:{R}:name, a queue's P:{q:Q}:name.
local function rkey(p, run, name) return p .. ':{' .. run .. '}:' .. name end
local function qkey(p, queue, name) return p .. ':{q:' .. queue .. '}:' .. name end
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The lease listing's set P:leases (standalone only, see LIST_LEASES): every run granted a lease that
-- was not released since.
local function note_lease(p, run) redis.call('ZADD', p .. ':leases', 0, run) end
local function forget_lease(p, run) redis.call('ZREM', p .. ':leases', run) end
-- A run's entry hash: q queue, s status, r ready_at ('' = none), n sequence, w wake '0'/'1',
-- p parent ('' = root), pr priority, d dedup id, st started_ms ('' = none; entries stored before
-- queue control have neither), m its claim-order member, loc 'r' ready / 'l' leased / '',
-- wt '1' when it is in its queue's waiting set.
local function load(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end
-- d and st are written only with a new entry (full): moving an entry leaves them as they are.
local function save(key, h, full)
  if full then
    redis.call('HSET', key, 'q', h.q, 's', h.s, 'r', h.r, 'n', h.n, 'w', h.w, 'p', h.p, 'pr', h.pr,
      'm', h.m, 'loc', h.loc, 'wt', h.wt, 'd', h.d, 'st', h.st)
  else
    redis.call('HSET', key, 'q', h.q, 's', h.s, 'r', h.r, 'n', h.n, 'w', h.w, 'p', h.p, 'pr', h.pr,
      'm', h.m, 'loc', h.loc, 'wt', h.wt)
  end
end
-- The run other than run whose live (not ended) entry holds dedup id d on queue q, or nil; and
-- the run the queue's dedup hash names.
local function live_holder(p, q, d, run)
  local other = redis.call('HGET', qkey(p, q, 'dedup'), d)
  if not other or other == run then return nil, other end
  local o = redis.call('HMGET', rkey(p, other, 'index'), 's', 'q', 'd')
  if o[1] and o[1] ~= 'terminal' and o[2] == q and o[3] == d then return other, other end
  return nil, other
end
-- Keep the dedup hashes in step with a run's entry changing from h (nil: none) to e (nil: gone):
-- a live entry holds its id (unless another live run does: a repair never takes it over), an
-- ended or removed one lets it go.
local function file_dedup(p, run, h, e)
  local was = h ~= nil and (h.d or '') ~= '' and h.s ~= 'terminal'
  local is = e ~= nil and e.d ~= '' and e.s ~= 'terminal'
  if was and not (is and e.q == h.q and e.d == h.d) then
    local key = qkey(p, h.q, 'dedup')
    if redis.call('HGET', key, h.d) == run then redis.call('HDEL', key, h.d) end
  end
  if is then
    local other, named = live_holder(p, e.q, e.d, run)
    if not other and named ~= run then redis.call('HSET', qkey(p, e.q, 'dedup'), e.d, run) end
  end
end
-- Drop a removed entry h of run from its queue's flow-control structures.
local function forget(p, run, h)
  file_dedup(p, run, h, nil)
  redis.call('ZREM', qkey(p, h.q, 'starts'), run)
  redis.call('ZREM', qkey(p, h.q, 'holding'), run)
end
-- The queue's runs in progress: holding members whose lease is live and whose root entry in the
-- queue has not ended. With prune, the other members are dropped.
local function in_progress(p, q, prune)
  local key = qkey(p, q, 'holding')
  local n = 0
  for _, run in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local counted = false
    if redis.call('PTTL', rkey(p, run, 'lease')) > 0 then
      local e = redis.call('HMGET', rkey(p, run, 'index'), 's', 'q', 'p')
      counted = e[1] ~= false and e[1] ~= 'terminal' and e[2] == q and e[3] == ''
    end
    if counted then n = n + 1 elseif prune then redis.call('ZREM', key, run) end
  end
  return n
end
-- The queue's starts (first claims) in the rate window of period ms ending at now_ms.
local function recent_starts(p, q, now_ms, period)
  local after = string.format('%.0f', tonumber(now_ms) - period)
  return redis.call('ZCOUNT', qkey(p, q, 'starts'), '(' .. after, '+inf')
end
-- Take the entry out of every claim structure it is in.
local function unplace(p, h)
  if h.loc == 'r' then redis.call('ZREM', qkey(p, h.q, 'ready'), h.m)
  elseif h.loc == 'l' then redis.call('ZREM', qkey(p, h.q, 'leased'), h.m) end
  if h.wt == '1' then
    local band = string.sub(h.m, 1, 20)
    local key = qkey(p, h.q, 'waiting:' .. band)
    redis.call('ZREM', key, h.m)
    if redis.call('ZCARD', key) == 0 then redis.call('ZREM', qkey(p, h.q, 'bands'), band) end
  end
  h.loc = ''
  h.wt = '0'
end
-- Put a root entry where claims look for it: a waiting run with a wake time in its priority band's
-- waiting set; a run with work now (or a wake request) in ready, or in leased (scored by the lease's
-- expiry) while someone holds its lease. Returns true when the run became claimable now.
local function place(p, run, h, now)
  h.loc = ''
  h.wt = '0'
  if h.p ~= '' or h.s == 'terminal' then return false end
  redis.call('SADD', p .. ':queues', h.q)
  if h.s == 'waiting' and h.r ~= '' then
    local band = string.sub(h.m, 1, 20)
    redis.call('ZADD', qkey(p, h.q, 'waiting:' .. band), 0, h.m)
    redis.call('ZADD', qkey(p, h.q, 'bands'), 0, band)
    h.wt = '1'
  end
  if h.s == 'new' or h.s == 'running' or h.w == '1' then
    local left = redis.call('PTTL', rkey(p, run, 'lease'))
    if left > 0 then
      redis.call('ZADD', qkey(p, h.q, 'leased'), now + left, h.m)
      h.loc = 'l'
    else
      redis.call('ZADD', qkey(p, h.q, 'ready'), 0, h.m)
      h.loc = 'r'
      return true
    end
  end
  return false
end
-- Store the entry given in a[i .. i + 9] (queue, status, ready_at, sequence, wake, parent, priority,
-- member, dedup id, started_ms) unless the stored one reflects a later sequence; a stored wake and
-- a stored start are kept. Returns true when the run became claimable now.
local function put(p, run, a, i, now)
  local key = rkey(p, run, 'index')
  local h = load(key)
  if h and tonumber(a[i + 3]) < tonumber(h.n) then return false end
  local was_ready = h ~= nil and h.loc == 'r'
  local wake = a[i + 4]
  local started = a[i + 9]
  if h then
    if h.w == '1' then wake = '1' end
    if started == '' and h.st then started = h.st end
    unplace(p, h)
  end
  local e = {q = a[i], s = a[i + 1], r = a[i + 2], n = a[i + 3], w = wake, p = a[i + 5], pr = a[i + 6],
    m = a[i + 7], d = a[i + 8], st = started}
  file_dedup(p, run, h, e)
  if e.st ~= '' and (not h or h.st ~= e.st or h.q ~= e.q) then
    if h and (h.st or '') ~= '' and h.q ~= e.q then redis.call('ZREM', qkey(p, h.q, 'starts'), run) end
    redis.call('ZADD', qkey(p, e.q, 'starts'), e.st, run)
  end
  local ready = place(p, run, e, now)
  save(key, e, true)
  return ready and not was_ready
end
"""

APPEND_INDEXED: Final = _check_and_append(
    17,
    # ARGV[5] 'write' (kept in the layout: nothing else is sent there any more);
    # ARGV[6] the prefix, ARGV[7] the wake-up channel, ARGV[8..17] the entry (see put()).
    # KEYS[5] lease string, KEYS[6] index hash (declared for the slot they share).
    # A live entry whose dedup id (ARGV[16]) another live run of its queue holds refuses the whole
    # append: {'duplicate', that run}.
    """
if ARGV[16] ~= '' and ARGV[9] ~= 'terminal' then
  local other = live_holder(ARGV[6], ARGV[8], ARGV[16], ARGV[4])
  if other then return {'duplicate', other} end
end
""",
    """
if put(ARGV[6], ARGV[4], ARGV, 8, server_ms()) then redis.call('PUBLISH', ARGV[7], '1') end
return {'ok', tostring(length + count)}
""",
).replace("local E = 17", _INDEX_LIB + "local E = 17", 1)

INDEX_PUT: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, wake-up channel, then 11 fields per entry: run id and the entry (see put()).
local p = ARGV[1]
local now = server_ms()
local woke = false
for i = 3, #ARGV, 11 do
  if put(p, ARGV[i], ARGV, i + 1, now) then woke = true end
end
if woke then redis.call('PUBLISH', ARGV[2], '1') end
return 1
"""
)

INDEX_WAKE: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, wake-up channel, run id. 0 if the run has no entry or has ended.
local p, run = ARGV[1], ARGV[3]
local key = rkey(p, run, 'index')
local h = load(key)
if not h or h.s == 'terminal' then return 0 end
h.w = '1'
if h.loc == '' then
  unplace(p, h)
  if place(p, run, h, server_ms()) then redis.call('PUBLISH', ARGV[2], '1') end
  save(key, h)
else
  redis.call('HSET', key, 'w', '1')
end
return 1
"""
)

CLAIM: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, owner, limit, ttl_ms, the member bound of now_ms ('0' .. 20 digits), nonce, now_ms,
-- the number H of held pairs, H pairs (queue, runs of it the claimant holds), then queues... (none:
-- every queue). Grants up to limit leases in claim order (priority, then ready_at, then run id)
-- under each queue's settings (mayfly.queues.plan_claim); replies run id, token, nonce, record
-- count and claim-order member of each. An empty owner only looks: it replies the members of the
-- runs it would grant, granting nothing. Run keys are built from the prefix (a shard's base on a
-- sharded Cluster store, whose hash tag they share).
local p, owner, limit, ttl, bound, nonce = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local now_ms = ARGV[7]
local now = server_ms()
local held = {}
local first_queue = 9 + 2 * tonumber(ARGV[8])
for i = 9, first_queue - 1, 2 do held[ARGV[i]] = tonumber(ARGV[i + 1]) end
local queues = {}
for i = first_queue, #ARGV do queues[#queues + 1] = ARGV[i] end
if #queues == 0 then queues = redis.call('SMEMBERS', p .. ':queues') end
-- Flow control: room[q] (runs the claim may still take from q) and starts[q] (first claims it may
-- still make) for each claimed queue with limits; a queue without settings has neither.
local room, starts, tracked = {}, {}, {}
if redis.call('EXISTS', p .. ':queue-settings') == 1 then
  local stored = {}
  local flat = redis.call('HGETALL', p .. ':queue-settings')
  for i = 1, #flat, 2 do stored[flat[i]] = flat[i + 1] end
  for _, q in ipairs(queues) do
    if stored[q] then
      local s = cjson.decode(stored[q])
      local conc, per_worker, rate = s.concurrency, s.worker_concurrency, s.rate_limit
      if conc == cjson.null then conc = nil end
      if per_worker == cjson.null then per_worker = nil end
      if rate == cjson.null then rate = nil end
      tracked[q] = true
      if conc or per_worker or rate then
        local r = limit
        -- The holding set bounds the runs in progress: count (and prune) only when it could bind.
        if conc and conc - redis.call('ZCARD', qkey(p, q, 'holding')) < r then
          r = math.min(r, conc - in_progress(p, q, true))
        end
        if per_worker then r = math.min(r, per_worker - (held[q] or 0)) end
        room[q] = math.max(0, r)
        starts[q] = limit
        if rate then starts[q] = math.max(0, rate - recent_starts(p, q, now_ms, s.rate_period_ms)) end
      end
    end
  end
end
local top = string.char(255)
local streams = {}
for _, q in ipairs(queues) do
  -- Runs whose holder's lease ran out (or was renewed: then it is scored again) go back in place.
  local leased = qkey(p, q, 'leased')
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', now)) do
    local run = string.sub(m, 43)
    local key = rkey(p, run, 'index')
    local h = load(key)
    redis.call('ZREM', leased, m)
    if h and h.m == m and h.loc == 'l' then
      local left = redis.call('PTTL', rkey(p, run, 'lease'))
      if left > 0 then
        redis.call('ZADD', leased, now + left, m)
      else
        h.loc = ''
        unplace(p, h)
        place(p, run, h, now)
        save(key, h)
      end
    end
  end
  streams[#streams + 1] = {key = qkey(p, q, 'ready'), hi = '+', q = q, ready = true, buf = {}, pos = 1}
  for _, band in ipairs(redis.call('ZRANGE', qkey(p, q, 'bands'), 0, -1)) do
    streams[#streams + 1] = {key = qkey(p, q, 'waiting:' .. band), hi = '[' .. band .. bound .. '|' .. top,
      q = q, ready = false, buf = {}, pos = 1}
  end
end
local page = limit + 16
local function head(s)
  if s.done or room[s.q] == 0 then return nil end
  if s.pos > #s.buf then
    s.buf = redis.call('ZRANGEBYLEX', s.key, s.last and ('(' .. s.last) or '-', s.hi, 'LIMIT', 0, page)
    s.pos = 1
    if #s.buf == 0 then s.done = true return nil end
  end
  return s.buf[s.pos]
end
local granted = {}
local count = 0
local seen = {}
local pruned = {}
while count < limit do
  local best, first = nil, nil
  for _, s in ipairs(streams) do
    local m = head(s)
    if m and (not first or m < first) then best, first = s, m end
  end
  if not best then break end
  best.pos = best.pos + 1
  best.last = first
  local run = string.sub(first, 43)
  if not seen[run] then
    seen[run] = true
    local key = rkey(p, run, 'index')
    local h = load(key)
    if not h or h.m ~= first then
      redis.call('ZREM', best.key, first)  -- left behind by an interrupted repair: not an entry
    else
      local lease = rkey(p, run, 'lease')
      local left = redis.call('PTTL', lease)
      if left > 0 then
        if best.ready then
          -- Held by a live owner: out of the way until its lease runs out.
          redis.call('ZREM', best.key, first)
          redis.call('ZADD', qkey(p, best.q, 'leased'), now + left, first)
          redis.call('HSET', key, 'loc', 'l')
        end
      else
        local q = h.q
        local start = h.s == 'new' and (h.st or '') == ''
        -- plan_claim: a limited queue needs room, and a start needs a start left in its window.
        local take = room[q] == nil or (room[q] > 0 and (not start or starts[q] > 0))
        if take and room[q] ~= nil then
          room[q] = room[q] - 1
          if start then starts[q] = starts[q] - 1 end
        end
        if take and owner == '' then
          count = count + 1
          granted[#granted + 1] = first
        elseif take then
          local fence = rkey(p, run, 'fence')
          redis.call('SET', lease, 'granting', 'PX', ttl)
          local token = tostring(redis.call('INCR', fence))
          local grant = nonce .. count
          redis.call('SET', lease, token .. ' ' .. grant .. ' ' .. owner, 'KEEPTTL')
          note_lease(p, run)
          if h.loc == 'r' then redis.call('ZREM', qkey(p, q, 'ready'), first) end
          local expiry = now + tonumber(ttl)
          redis.call('ZADD', qkey(p, q, 'leased'), expiry, first)
          if tracked[q] then redis.call('ZADD', qkey(p, q, 'holding'), expiry, run) end
          if start then
            -- A start: recorded on the entry and in the queue's starts, at the claim's now_ms.
            redis.call('HSET', key, 'loc', 'l', 'w', '0', 'st', now_ms)
            local recorded = qkey(p, q, 'starts')
            redis.call('ZADD', recorded, now_ms, run)
            if not pruned[q] then
              pruned[q] = true  -- no rate window is longer than 30 days
              redis.call('ZREMRANGEBYSCORE', recorded, '-inf',
                '(' .. string.format('%.0f', tonumber(now_ms) - 2592000000))
            end
          else
            redis.call('HSET', key, 'loc', 'l', 'w', '0')
          end
          count = count + 1
          granted[#granted + 1] = run
          granted[#granted + 1] = token
          granted[#granted + 1] = grant
          granted[#granted + 1] = tostring(redis.call('LLEN', rkey(p, run, 'records')))
          granted[#granted + 1] = first
        end
      end
    end
  end
end
return granted
"""
)

NEXT_WAKE: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, the member bound of now_ms, queues... (none: every queue). The smallest ready_at
-- part of a waiting member after now, or false.
local p, bound = ARGV[1], ARGV[2]
local queues = {}
for i = 3, #ARGV do queues[#queues + 1] = ARGV[i] end
if #queues == 0 then queues = redis.call('SMEMBERS', p .. ':queues') end
local best = false
for _, q in ipairs(queues) do
  for _, band in ipairs(redis.call('ZRANGE', qkey(p, q, 'bands'), 0, -1)) do
    local after = '(' .. band .. bound .. '|' .. string.char(255)
    local found = redis.call('ZRANGEBYLEX', qkey(p, q, 'waiting:' .. band), after, '+', 'LIMIT', 0, 1)
    if found[1] then
      local ready = string.sub(found[1], 22, 41)
      if not best or ready < best then best = ready end
    end
  end
end
return best
"""
)

RELEASE: Final = (
    _INDEX_LIB
    + """
-- KEYS: lease string, index hash; ARGV: the exact lease value, the prefix ('' on a Cluster: the
-- run index is not kept there), run id. A released run goes back where claims find it at once.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  forget_lease(ARGV[2], ARGV[3])
  local h = load(KEYS[2])
  if h then redis.call('ZREM', qkey(ARGV[2], h.q, 'holding'), ARGV[3]) end
  if h and h.loc == 'l' then
    unplace(ARGV[2], h)
    place(ARGV[2], ARGV[3], h, server_ms())
    save(KEYS[2], h)
  end
end
return 1
"""
)

PURGE: Final = (
    _INDEX_LIB
    + """
-- KEYS: lease string, records list, ids hash, snapshot string, index hash (the fence string is kept)
-- ARGV: the prefix ('' on a Cluster), run id. A live lease refuses the purge; otherwise everything
-- of the run but its fence goes at once, its run index entry (its dedup id and start) too.
local holder = redis.call('GET', KEYS[1])
if holder then return {'held', holder} end
if ARGV[1] ~= '' then
  forget_lease(ARGV[1], ARGV[2])
  local h = load(KEYS[5])
  if h then
    unplace(ARGV[1], h)
    forget(ARGV[1], ARGV[2], h)
  end
end
redis.call('DEL', KEYS[5])
return {'purged', tostring(redis.call('DEL', KEYS[2], KEYS[3], KEYS[4]))}
"""
)

QUEUE_USAGE: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, queue, now_ms. Its runs in progress and, if it has a rate limit, its starts within
-- the window ending at now_ms (read only: nothing is pruned).
local p, q = ARGV[1], ARGV[2]
local stored = redis.call('HGET', p .. ':queue-settings', q)
local period = stored and cjson.decode(stored).rate_period_ms
local starts = 0
if period and period ~= cjson.null then starts = recent_starts(p, q, ARGV[3], period) end
return {in_progress(p, q, false), starts}
"""
)

QUEUE_SET: Final = (
    _INDEX_LIB
    + """
-- ARGV: prefix, queue, its settings (msgspec JSON). Stores them; a queue that had none starts
-- tracking its runs in progress with those leased now (claims track it from then on).
local p, q = ARGV[1], ARGV[2]
local had = redis.call('HSET', p .. ':queue-settings', q, ARGV[3]) == 0
if not had then
  local now = server_ms()
  for _, m in ipairs(redis.call('ZRANGE', qkey(p, q, 'leased'), 0, -1)) do
    local run = string.sub(m, 43)
    local left = redis.call('PTTL', rkey(p, run, 'lease'))
    if left > 0 then redis.call('ZADD', qkey(p, q, 'holding'), now + left, run) end
  end
end
return 1
"""
)


# -- the sharded Cluster layout (mayfly_redis._layout) -----------------------------------------------

_RKEY: Final = "local function rkey(p, run, name) return p .. ':{' .. run .. '}:' .. name end"
_QKEY: Final = "local function qkey(p, queue, name) return p .. ':{q:' .. queue .. '}:' .. name end"
# On a sharded Cluster store P is a shard's base 'P:{P:k}', whose hash tag every key shares.
_SHARDED_RKEY: Final = "local function rkey(p, run, name) return p .. ':' .. run .. ':' .. name end"
_SHARDED_QKEY: Final = "local function qkey(p, queue, name) return p .. ':q:' .. queue .. ':' .. name end"
# A Cluster store keeps no lease listing (its leases sit in every shard's slots): nothing to file.
_NOTE_LEASE: Final = "local function note_lease(p, run) redis.call('ZADD', p .. ':leases', 0, run) end"
_FORGET_LEASE: Final = "local function forget_lease(p, run) redis.call('ZREM', p .. ':leases', run) end"
_SHARDED_NOTE_LEASE: Final = "local function note_lease(p, run) end"
_SHARDED_FORGET_LEASE: Final = "local function forget_lease(p, run) end"
_sharded: dict[str, str] = {}


def for_layout(source: str, sharded: bool) -> str:
    """The script ``source`` as it runs on the layout: unchanged, or building keys under a shard's tag."""
    if not sharded:
        return source
    found = _sharded.get(source)
    if found is None:
        found = _sharded[source] = (
            source.replace(_RKEY, _SHARDED_RKEY)
            .replace(_QKEY, _SHARDED_QKEY)
            .replace(_NOTE_LEASE, _SHARDED_NOTE_LEASE)
            .replace(_FORGET_LEASE, _SHARDED_FORGET_LEASE)
        )
    return found
