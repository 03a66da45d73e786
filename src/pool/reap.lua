-- reap: the reclaim step of acquire alone, for a maintenance loop: expired
-- leases come back, and so do ids whose quarantine has ended.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:meta  5 {P}:disabled
--       6 {P}:requests  7 {P}:parked  8 {P}:quarantine  9 {P}:reasons
-- ARGV: 1 limit (leases, and quarantines, per call)  2 cooldown_ms
-- Returns: {now_ms, still_expired, quarantines_ended, id...}: the ids of the
--          expired leases (deadline <= now) moved back to ready at now +
--          cooldown (disabled ids stay out of ready), how many expired
--          leases are left for the next call, and how many quarantines
--          ended (their ids due now unless disabled).
-- Errors: BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'meta', 'disabled', 'requests', 'parked', 'quarantine', 'reasons',
})
if err then return err end
if #ARGV ~= 2 then
  return badarg('ARGV', 'limit, cooldown_ms')
end
local limit, cooldown
limit, err = int_arg('limit', ARGV[1])
if err then return err end
cooldown, err = int_arg('cooldown_ms', ARGV[2])
if err then return err end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.meta, 'hash' },
  { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' }, { K.quarantine, 'zset' },
  { K.reasons, 'hash' },
})
if err then return err end

local now = now_ms()
local ids = reclaim(K, now, cooldown, limit)
local ended = end_quarantines(K, now, limit)
local reply = { now, redis.call('ZCOUNT', K.leases, '-inf', now), ended }
for _, id in ipairs(ids) do
  table.insert(reply, id)
end
return reply
