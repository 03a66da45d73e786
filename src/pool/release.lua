-- release: hand a leased id back; it becomes due again after the cooldown.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:meta  5 {P}:disabled
--       6 {P}:requests  7 {P}:parked
-- ARGV: 1 id  2 token
--       3 cooldown_ms
-- Returns: {1, now_ms} released (a disabled id stays out of ready, its
--          cooldown kept in parked);
--          {0, now_ms, 'not_owner' | 'expired'} and nothing changed, when
--          owners[id] is not the token or the deadline is not after now.
-- Errors: BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({ 'ready', 'leases', 'owners', 'meta', 'disabled', 'requests', 'parked' })
if err then return err end
if #ARGV ~= 3 then
  return badarg('ARGV', 'id, token, cooldown_ms')
end
local id, token = ARGV[1], ARGV[2]
err = name_arg('id', id) or token_arg(token)
if err then return err end
local cooldown
cooldown, err = int_arg('cooldown_ms', ARGV[3])
if err then return err end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.meta, 'hash' },
  { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' },
})
if err then return err end

local now = now_ms()
if redis.call('HGET', K.owners, id) ~= token then
  return { 0, now, 'not_owner' }
end
local deadline = redis.call('ZSCORE', K.leases, id)
if not deadline or tonumber(deadline) <= now then
  return { 0, now, 'expired' }
end

end_lease(K, id, now, cooldown)
return { 1, now }
