-- add: put new ids into an existing (or empty) pool, due at once.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
-- ARGV: 1.. ids (distinct)
-- Returns: the number of ids added. Refused (DUPID) when any id is already
-- in ready, leases, owners or disabled; BADARG, KEYTYPE as in common.lua.

local _, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled' })
if err then return err end
err = ids_arg(1)
if err then return err end
err = key_types({ { KEYS[1], 'zset' }, { KEYS[2], 'zset' }, { KEYS[3], 'hash' }, { KEYS[4], 'set' } })
if err then return err end
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
      or redis.call('HEXISTS', KEYS[3], id) == 1 or redis.call('SISMEMBER', KEYS[4], id) == 1 then
    return fail('DUPID', id)
  end
end

for i = 1, #ARGV do
  redis.call('ZADD', KEYS[1], 0, ARGV[i])
end
return #ARGV
