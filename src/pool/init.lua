-- init: create a pool with its first ids, all due at once.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta
--       6 {P}:disabled  7 {P}:requests  8 {P}:parked
-- ARGV: 1.. ids (distinct)
-- Returns: the number of ids added. Refused (POOLEXISTS) when any of the
-- keys exists; BADARG, DUPID, KEYTYPE as in common.lua.

local K, err = pool_keys({ 'ready', 'leases', 'owners', 'fence', 'meta', 'disabled', 'requests', 'parked' })
if err then return err end
err = ids_arg(1)
if err then return err end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.fence, 'string' },
  { K.meta, 'hash' }, { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' },
})
if err then return err end
if redis.call('EXISTS', unpack(KEYS)) > 0 then
  return fail('POOLEXISTS', K.pool_name)
end

for i = 1, #ARGV do
  redis.call('ZADD', K.ready, 0, ARGV[i])
end
-- The counter marks the pool as initialised even while every id is leased.
redis.call('SET', K.fence, 0)
return #ARGV
