-- init: create a pool with its first ids, all due at once, and its strike
-- setting.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta
--       6 {P}:disabled  7 {P}:requests  8 {P}:parked  9 {P}:quarantine
--       10 {P}:reasons  11 {P}:strikes  12 {P}:autodisabled  13 {P}:config
-- ARGV: 1 max_strikes  2 strike_window_ms (both 'off': no strikes)
--       3.. ids (distinct)
-- Returns: the number of ids added. Refused (POOLEXISTS) when any of the
-- keys exists; BADARG, DUPID, KEYTYPE as in common.lua.

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'fence', 'meta', 'disabled', 'requests', 'parked',
  'quarantine', 'reasons', 'strikes', 'autodisabled', 'config',
})
if err then return err end
local max, window
max, window, err = strikes_args(1)
if err then return err end
err = ids_arg(3) or key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.fence, 'string' },
  { K.meta, 'hash' }, { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' },
  { K.quarantine, 'zset' }, { K.reasons, 'hash' }, { K.strikes, 'hash' }, { K.autodisabled, 'hash' },
  { K.config, 'hash' },
})
if err then return err end
if redis.call('EXISTS', unpack(KEYS)) > 0 then
  return fail('POOLEXISTS', K.pool_name)
end

for i = 3, #ARGV do
  redis.call('ZADD', K.ready, 0, ARGV[i])
end
-- The counter marks the pool as initialised even while every id is leased.
redis.call('SET', K.fence, 0)
local _, record = node_gate(false, 0, now_ms(), false)
redis.call('HSET', K.meta, '~node', record)
set_strikes(K, max, window)
return #ARGV - 2
