-- Claim the lowest free worker ID in one round trip (worker-id.md, "Claim").
--
-- KEYS[1..n]  lease keys of IDs 0..n-1, in ID order
-- ARGV[1]     owner string "<identity>#<nonce>"
-- ARGV[2]     TTL in milliseconds (integer >= 1)
--
-- Returns {index, how, wrong}:
--   index  0-based position of the key now held by us, or -1 when every
--          key is held (by others or by keys of another type)
--   how    1 = claimed now with SET NX PX; 2 = already ours (an earlier
--          claim whose reply was lost ran after all; TTL reset), 0 = none
--   wrong  0-based positions of keys of another type (never touched)
-- A key holding exactly our owner string is adopted before any new claim,
-- so a retried claim never takes a second ID. Keys are only written by
-- SET NX, never overwritten.
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR claim: ttl must be an integer >= 1 ms')
end
local first_free = -1
local wrong = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key).ok
  if kind == 'string' then
    if redis.call('GET', key) == ARGV[1] then
      -- Reset the TTL: validity is counted from this call's send time.
      redis.call('PEXPIRE', key, ttl)
      return {i - 1, 2, wrong}
    end
  elseif kind == 'none' then
    if first_free < 0 then first_free = i - 1 end
  else
    wrong[#wrong + 1] = i - 1
  end
end
if first_free < 0 then
  return {-1, 0, wrong}
end
redis.call('SET', KEYS[first_free + 1], ARGV[1], 'NX', 'PX', ttl)
return {first_free, 1, wrong}
