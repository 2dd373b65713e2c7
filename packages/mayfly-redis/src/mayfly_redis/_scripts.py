"""The server-side Lua scripts: compare-and-append and the lease operations.

Each script runs atomically on the server and touches only keys of one run
(one hash tag), so it works unchanged on Redis Cluster. Scripts are always
called by SHA; a ``NOSCRIPT`` reply (first use, server restarted, failover,
``SCRIPT FLUSH``) loads them (``SCRIPT LOAD``) and retries once.

Numbers cross the Lua boundary as decimal strings and are compared as strings
where precision matters: Lua numbers are doubles, fencing tokens are int64.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ACQUIRE", "APPEND", "PURGE", "READ", "RELEASE", "RENEW"]

APPEND: Final = """
-- KEYS: records list, ids hash, fence string [, runs index zset (standalone only)]
-- ARGV: fence ('' = none), expected_next, count, run_id, then one list element per
--       record ('<seq>\\n<event_id>\\n<type>\\n<version>\\n<checksum>\\n<payload>'), exactly the
--       bytes stored; the event id and the identity '<seq> <checksum>' are read from it.
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
    string.match(ARGV[4 + i], '^(%d+)\\n([^\\n]+)\\n[^\\n]*\\n[^\\n]*\\n([^\\n]+)\\n')
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
    local first = tonumber(string.match(ARGV[5], '^(%d+)\\n'))
    local elements = redis.call('LRANGE', KEYS[1], first - 1, first + count - 2)
    for i = 1, count do
      if elements[i] ~= ARGV[4 + i] then return {'damaged', tostring(first + i - 1)} end
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
for first = 1, count, 500 do
  local last = math.min(first + 499, count)
  local fields = {}
  for i = first, last do
    fields[#fields + 1] = ids[i]
    fields[#fields + 1] = identities[i]
  end
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 4 + first, 4 + last))
  redis.call('HSET', KEYS[2], unpack(fields))
end
if actual == 1 and KEYS[4] then redis.call('ZADD', KEYS[4], 0, ARGV[4]) end
return {'ok', tostring(length + count)}
"""

READ: Final = """
-- KEYS: records list, ids hash; ARGV: LRANGE start, stop
-- One atomic reply: how many records were ever appended (the index) and the window.
return {redis.call('HLEN', KEYS[2]), redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])}
"""

ACQUIRE: Final = """
-- KEYS: lease string, fence string; ARGV: nonce, owner, ttl_ms
-- The lease value is '<token> <nonce> <owner>'. A retried acquire whose reply was
-- lost finds its own nonce and gets its grant back instead of LeaseHeld.
if redis.call('SET', KEYS[1], 'granting', 'NX', 'PX', ARGV[3]) then
  redis.call('INCR', KEYS[2])
  local token = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1] .. ' ' .. ARGV[2], 'KEEPTTL')
  return {'granted', token}
end
local holder = redis.call('GET', KEYS[1])
local token, nonce, owner = string.match(holder, '^(%d+) (%S+) (.*)$')
if nonce == ARGV[1] then return {'granted', token} end
return {'held', owner or holder}
"""

RENEW: Final = """
-- KEYS: lease string; ARGV: the exact lease value, ttl_ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

RELEASE: Final = """
-- KEYS: lease string; ARGV: the exact lease value
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

PURGE: Final = """
-- KEYS: lease string, records list, ids hash, snapshot string (the fence string is kept)
-- A live lease refuses the purge; otherwise everything of the run but its fence goes at once.
local holder = redis.call('GET', KEYS[1])
if holder then return {'held', holder} end
return {'purged', tostring(redis.call('DEL', KEYS[2], KEYS[3], KEYS[4]))}
"""
