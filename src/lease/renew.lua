-- Renew a worker-ID lease if it is still ours (README, "Renewal").
--
-- KEYS[1]  lease key, e.g. snowflake:worker:<app>:<id>
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  TTL in milliseconds (integer >= 1)
-- ARGV[3]  "1": re-create a missing key (Redis lost its data while our lease
--          was still valid on our side); "0": a missing key means lost
--          (re-adoption from a state file is never proof on its own)
--
-- Returns  1  extended: the key held our owner string; PEXPIRE set
--          2  re-created: the key was missing; SET owner PX ttl done
--          0  lost: the key holds another value, another type, or is
--             missing with ARGV[3] = "0". Nothing was written.
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR renew: ttl must be an integer >= 1 ms')
end
-- pcall: a key of another type answers WRONGTYPE; that is someone else's.
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' and value.err then
  return 0
end
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
if value == false and ARGV[3] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
  return 2
end
return 0
