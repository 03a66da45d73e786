-- Acquire a lock: SET NX PX the lock key to our owner string and, only when
-- that succeeded, count the lock's fencing token up (docs/lock.md).
--
-- KEYS[1]  lock key, <prefix>{<name>}
-- KEYS[2]  fence counter, <prefix>{<name>}:fence: an integer string without
--          expiry (same hash tag {<name>}, so the same Cluster slot)
-- KEYS[3]  node record, <prefix>{<name>}:node: "<ttl_ms>:<open_at_ms>.<stamp>"
--          without expiry (node.lua's node_gate), same hash tag
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  TTL in milliseconds (integer >= 1)
--
-- Returns {status, value}:
--   {1, fence}  acquired now: SET NX PX done; fence = INCR of KEYS[2]
--   {2, fence}  already ours (an earlier acquire whose reply was lost ran
--               after all): TTL reset; fence = the counter, not counted up
--               (counted up only when it is missing)
--   {0, pttl}   held by another owner; pttl = ms until that key expires
--               (-1: the key has no expiry)
--   {3, wait}   closed after Redis restarted or failed over (see below):
--               nothing acquired for wait ms
--   {4, wait, record}
--               a new lock (no record, no fence, no key), written closed
--               and marked new (node.lua's node_gate), or one still marked
--               so: nothing acquired; the caller opens it once `record` is
--               durable (lease/node_open.lua), else it stays closed
-- Errors (nothing written): a key of another type, a fence that is not an
-- integer, a bad TTL, INFO refused (node.lua).
--
-- Rollback gate (docs/lock.md, "After a Redis rollback"): Redis restarted
-- from an older snapshot or failed over to a lagging replica may have lost
-- the lock key of a holder that still runs, and fences handed out since. It
-- shows as a node record of another node (or none beside a fence counter:
-- written by a version without records). That holder last acquired or
-- renewed before now, for at most its TTL, so nobody acquires (not even an
-- owner whose key survived: it may have expired and been taken since) until
-- now + the largest TTL seen, and the fence is lifted above every fence
-- handed out before (lift_fence). A lock with no record, fence or key is new,
-- or its first use was lost with a rollback to a snapshot older than it:
-- closed the same way, until its caller has made the record durable.
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR lock: ttl must be an integer >= 1 ms')
end
local lock_type = redis.call('TYPE', KEYS[1]).ok
if lock_type ~= 'none' and lock_type ~= 'string' then
  return redis.error_reply('ERR lock: ' .. KEYS[1] .. ' has type ' .. lock_type .. ', expected string')
end
-- Checked before the SET: a script is not rolled back when it fails later.
local fence_type = redis.call('TYPE', KEYS[2]).ok
local fence = 0
if fence_type == 'string' then
  fence = tonumber(redis.call('GET', KEYS[2]))
  if fence == nil or fence ~= math.floor(fence) then
    return redis.error_reply('ERR lock: ' .. KEYS[2] .. ' is not an integer')
  end
elseif fence_type ~= 'none' then
  return redis.error_reply('ERR lock: ' .. KEYS[2] .. ' has type ' .. fence_type .. ', expected string')
end
local record_type = redis.call('TYPE', KEYS[3]).ok
if record_type ~= 'none' and record_type ~= 'string' then
  return redis.error_reply('ERR lock: ' .. KEYS[3] .. ' has type ' .. record_type .. ', expected string')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local active = fence_type ~= 'none' or lock_type ~= 'none'
local open_at, record, rolled_back, new_store, stored = node_gate(redis.call('GET', KEYS[3]), ttl, now, active)
if record then redis.call('SET', KEYS[3], record) end
if rolled_back then lift_fence(KEYS[2], now) end
if new_store then
  return {4, open_at - now, stored}
end
if open_at > now then
  return {3, open_at - now}
end
if lock_type == 'string' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    -- Validity is counted from this call's send time, so restart the TTL.
    redis.call('PEXPIRE', KEYS[1], ttl)
    -- A counter deleted by hand starts again, never at 0.
    if fence_type == 'none' then fence = redis.call('INCR', KEYS[2]) end
    return {2, fence}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl)
return {1, redis.call('INCR', KEYS[2])}
