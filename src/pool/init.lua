-- init: create a pool with its first ids, all due at once, and its strike
-- setting.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta
--       6 {P}:disabled  7 {P}:requests  8 {P}:parked  9 {P}:quarantine
--       10 {P}:reasons  11 {P}:strikes  12 {P}:autodisabled  13 {P}:config
-- ARGV: 1 max_strikes  2 strike_window_ms (both 'off': no strikes)
--       3 max_lease_ms: how long the new pool stays closed unless its caller
--         opens it (below)
--       4.. ids (distinct)
-- Returns: {the number of ids added, the pool's record as written}.
-- Refused (POOLEXISTS) when any of the keys exists; BADARG, DUPID, KEYTYPE
-- as in common.lua.
--
-- The pool is written closed, its fence lifted, and marked new, as a first
-- acquire does (node.lua's node_gate; max_lease_ms is the time it opens by
-- where durability cannot be checked): a pool lost with a rollback to a snapshot
-- older than this init looks new again, and init run again (a deploy step)
-- must not lease its ids while holders of the lost pool's leases may still
-- use them. The caller opens it (lease/node_open.lua: fence back to 0) once
-- the record is durable, after which no rollback can lose the pool.

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'fence', 'meta', 'disabled', 'requests', 'parked',
  'quarantine', 'reasons', 'strikes', 'autodisabled', 'config',
})
if err then return err end
local max, window
max, window, err = strikes_args(1)
if err then return err end
local max_lease
max_lease, err = int_arg('max_lease_ms', ARGV[3])
if err then return err end
err = ids_arg(4) or key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.fence, 'string' },
  { K.meta, 'hash' }, { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' },
  { K.quarantine, 'zset' }, { K.reasons, 'hash' }, { K.strikes, 'hash' }, { K.autodisabled, 'hash' },
  { K.config, 'hash' },
})
if err then return err end
if redis.call('EXISTS', unpack(KEYS)) > 0 then
  return fail('POOLEXISTS', K.pool_name)
end

for i = 4, #ARGV do
  redis.call('ZADD', K.ready, 0, ARGV[i])
end
-- The counter marks the pool as initialised even while every id is leased.
local now = now_ms()
redis.call('SET', K.fence, 0)
lift_fence(K.fence, now)
local record = string.format('0:%s', stamped(now + max_lease)) .. new_mark()
redis.call('HSET', K.meta, '~node', record)
set_strikes(K, max, window)
return { #ARGV - 3, record }
