-- add: put new ids into an existing (or empty) pool, due at once.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled  5 {P}:quarantine
-- ARGV: 1.. ids (distinct)
-- Returns: the number of ids added. Refused (DUPID) when any id is already
-- in ready, leases, owners, disabled or quarantine; BADARG, KEYTYPE as in
-- common.lua.

local K, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled', 'quarantine' })
if err then return err end
err = ids_arg(1) or key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.disabled, 'set' },
  { K.quarantine, 'zset' },
})
if err then return err end
for i = 1, #ARGV do
  if known(K, ARGV[i]) then
    return fail('DUPID', ARGV[i])
  end
end

for i = 1, #ARGV do
  redis.call('ZADD', K.ready, 0, ARGV[i])
end
return #ARGV
