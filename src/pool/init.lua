-- init: create a pool with its first ids, all due at once.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta  6 {P}:disabled
-- ARGV: 1.. ids, 1-1000 distinct ids of 1-64 chars of [A-Za-z0-9_-]
-- Returns: the number of ids added. Refused (POOLEXISTS) when any of the
-- keys exists; BADARG, DUPID, KEYTYPE as in common.lua.

local pool, err = pool_keys({ 'ready', 'leases', 'owners', 'fence', 'meta', 'disabled' })
if err then return err end
err = ids_arg(1)
if err then return err end
err = key_types({
  { KEYS[1], 'zset' }, { KEYS[2], 'zset' }, { KEYS[3], 'hash' },
  { KEYS[4], 'string' }, { KEYS[5], 'hash' }, { KEYS[6], 'set' },
})
if err then return err end
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) > 0 then
  return fail('POOLEXISTS', pool)
end

for i = 1, #ARGV do
  redis.call('ZADD', KEYS[1], 0, ARGV[i])
end
-- The counter marks the pool as initialised even while every id is leased.
redis.call('SET', KEYS[4], 0)
return #ARGV
