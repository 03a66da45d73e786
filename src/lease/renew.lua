-- Renew a worker-ID lease if it is still ours (docs/worker.md, "Renewal").
--
-- KEYS[1]  lease key, e.g. snowflake:worker:<app>:<id>
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  TTL in milliseconds (integer >= 1)
-- ARGV[3]  Redis time (ms) before which a missing key is set again: the
--          expires_ms of our last confirmed claim or renew minus the safety
--          margin (lease::recreate_before). Before it the key should still
--          exist, so only a Redis data loss removed it; from it on the key
--          may have expired and been claimed by another owner (and lost
--          again). "0": never (re-adoption from a state file is no proof on
--          its own)
--
-- Returns {code, expires_ms}:
--   code        1  extended: the key held our owner string; PEXPIRE set
--               2  re-created: the key was missing before ARGV[3]; SET PX done
--               0  lost: the key holds another value, another type, or is
--                  missing and ARGV[3] has passed. Nothing was written.
--   expires_ms  TIME + ttl: when a key written now expires, up to the few
--               ms (more on a stalled server) between the script's start,
--               from which Redis counts the expiry, and this TIME call; the
--               caller's margin covers that
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR renew: ttl must be an integer >= 1 ms')
end
local recreate_before = tonumber(ARGV[3])
if recreate_before == nil then
  return redis.error_reply('ERR renew: recreate_before must be a Redis time in ms, or 0')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = now + ttl
-- pcall: a key of another type answers WRONGTYPE; that is someone else's.
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' and value.err then
  return {0, expires}
end
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, expires}
end
if value == false and now < recreate_before then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
  return {2, expires}
end
return {0, expires}
