-- config: read or set the pool's strike setting (stored in {P}:config).
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:disabled
--       6 {P}:quarantine  7 {P}:config
-- ARGV: none (read), or 1 max_strikes  2 strike_window_ms (both 'off':
--       strikes off)
-- Returns: {max_strikes, strike_window_ms} after the call; 0, 0 when off.
-- Errors: NOPOOL when the pool has none of the first six keys (init
-- first); BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({ 'ready', 'leases', 'owners', 'fence', 'disabled', 'quarantine', 'config' })
if err then return err end
if #ARGV ~= 0 and #ARGV ~= 2 then
  return badarg('ARGV', 'none, or max_strikes, strike_window_ms')
end
local max, window
if #ARGV == 2 then
  max, window, err = strikes_args(1)
  if err then return err end
end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.fence, 'string' },
  { K.disabled, 'set' }, { K.quarantine, 'zset' }, { K.config, 'hash' },
})
if err then return err end
if redis.call('EXISTS', K.ready, K.leases, K.owners, K.fence, K.disabled, K.quarantine) == 0 then
  return fail('NOPOOL', K.pool_name)
end

if #ARGV == 2 then
  set_strikes(K, max, window)
end
return {
  tonumber(redis.call('HGET', K.config, 'max_strikes') or '0') or 0,
  tonumber(redis.call('HGET', K.config, 'strike_window_ms') or '0') or 0,
}
