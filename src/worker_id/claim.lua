-- Claim the lowest free worker ID in one round trip (docs/worker.md, "Claim").
--
-- KEYS[1..n]  lease keys of IDs 0..n-1, in ID order
-- KEYS[n+1]   claim guard of the app, e.g. snowflake:worker:<app>:guard: a
--             string without expiry holding the Redis time (ms) from which
--             new claims are allowed
-- ARGV[1]     owner string "<identity>#<nonce>"
-- ARGV[2]     TTL in milliseconds (integer >= 1)
--
-- Returns {index, how, wrong, wait_ms, expires_ms}:
--   index       0-based position of the key now held by us, -1 when every
--               key is held, -2 when claims are paused (see wait_ms)
--   how         with index >= 0: 1 = claimed now with SET NX PX; 2 = already
--               ours (an earlier claim whose reply was lost ran after all;
--               TTL reset). With index -2: 1 = the guard was missing and is
--               set now (fresh Redis, or it lost its data); 2 = the guard was
--               more than one TTL ahead and is pulled in; 0 = the guard is
--               closed as set before. Else 0
--   wrong       0-based positions of keys of another type (never touched)
--   wait_ms     with index -2: ms until claims are allowed; else 0
--   expires_ms  TIME + ttl: when a key written now expires (see renew.lua);
--               the first renew derives its ARGV[3] from it
--
-- The guard: a Redis without it is fresh or lost its data (restart without
-- persistence, FLUSHALL). Holders from before may still publish their IDs
-- until their own validity deadline, at most one TTL away, and re-create
-- their keys at their next renew. So the first claimant sets the guard to
-- now + TTL and nobody claims a new ID before then. Time is Redis' TIME.
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR claim: ttl must be an integer >= 1 ms')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = now + ttl
local guard_key = KEYS[#KEYS]
local guard_type = redis.call('TYPE', guard_key).ok
if guard_type ~= 'none' and guard_type ~= 'string' then
  return redis.error_reply('ERR claim: ' .. guard_key .. ' has type ' .. guard_type .. ', expected string')
end
local first_free = -1
local wrong = {}
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  local kind = redis.call('TYPE', key).ok
  if kind == 'string' then
    if redis.call('GET', key) == ARGV[1] then
      -- Reset the TTL: validity is counted from this call's send time.
      redis.call('PEXPIRE', key, ttl)
      return {i - 1, 2, wrong, 0, expires}
    end
  elseif kind == 'none' then
    if first_free < 0 then first_free = i - 1 end
  else
    wrong[#wrong + 1] = i - 1
  end
end
local guard = redis.call('GET', guard_key)
local open_at = tonumber(guard)
-- Missing: set it. Unreadable, or further away than one TTL (written by
-- hand, or Redis' clock went back): no holder of this app (one TTL for all
-- its sidecars, see docs/worker.md) needs more, so start one TTL from now instead.
local guard_how = 0
if open_at == nil or open_at > now + ttl then
  if guard == false then guard_how = 1 else guard_how = 2 end
  open_at = now + ttl
  redis.call('SET', guard_key, open_at)
end
if now < open_at then
  return {-2, guard_how, wrong, open_at - now, 0}
end
if first_free < 0 then
  return {-1, 0, wrong, 0, 0}
end
redis.call('SET', KEYS[first_free + 1], ARGV[1], 'NX', 'PX', ttl)
return {first_free, 1, wrong, 0, expires}
