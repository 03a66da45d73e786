-- Acquire a lock: SET NX PX the lock key to our owner string and, only when
-- that succeeded, count the lock's fencing token up (docs/lock.md).
--
-- KEYS[1]  lock key, <prefix>{<name>}
-- KEYS[2]  fence counter, <prefix>{<name>}:fence: an integer string without
--          expiry (same hash tag {<name>}, so the same Cluster slot)
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
-- Errors (nothing written): a key of another type, a fence that is not an
-- integer, a bad TTL.
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
