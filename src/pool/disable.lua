-- disable: take ids out of service until enable. A ready id leaves ready at
-- once; a leased id stays leased, and its release or expiry leaves it out of
-- ready. Acquire skips disabled ids that a worker put back into ready.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
-- ARGV: 1.. ids, 1-1000 distinct ids of 1-64 chars of [A-Za-z0-9_-]
-- Returns: the number of ids newly disabled (already disabled ones count 0).
-- Errors: NOID when an id is in none of ready, leases, owners, disabled;
--         BADARG, DUPID, KEYTYPE as in common.lua.

local ready, leases, owners, disabled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local _, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled' })
if err then return err end
err = ids_arg(1)
if err then return err end
err = key_types({ { ready, 'zset' }, { leases, 'zset' }, { owners, 'hash' }, { disabled, 'set' } })
if err then return err end
for i = 1, #ARGV do
  local id = ARGV[i]
  if not (redis.call('ZSCORE', ready, id) or redis.call('ZSCORE', leases, id)
      or redis.call('HEXISTS', owners, id) == 1 or redis.call('SISMEMBER', disabled, id) == 1) then
    return fail('NOID', id)
  end
end

local count = 0
for i = 1, #ARGV do
  count = count + redis.call('SADD', disabled, ARGV[i])
  redis.call('ZREM', ready, ARGV[i])
end
return count
