-- status: counts of the pool's ids by state; never tokens.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
-- ARGV: none
-- Returns: {now_ms, ready_due, ready_cooling, leases_valid, leases_expired,
--           disabled} where ready_due have score <= now, leases_valid a
--          deadline after now and leases_expired one not yet reclaimed;
--          disabled counts disabled ids, leased or not.
-- Errors: BADARG, KEYTYPE as in common.lua.

local ready, leases, owners, disabled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local _, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled' })
if err then return err end
if #ARGV ~= 0 then
  return badarg('ARGV', 'none')
end
err = key_types({ { ready, 'zset' }, { leases, 'zset' }, { owners, 'hash' }, { disabled, 'set' } })
if err then return err end

local now = now_ms()
local due = redis.call('ZCOUNT', ready, '-inf', now)
local expired = redis.call('ZCOUNT', leases, '-inf', now)
return {
  now,
  due,
  redis.call('ZCARD', ready) - due,
  redis.call('ZCARD', leases) - expired,
  expired,
  redis.call('SCARD', disabled),
}
