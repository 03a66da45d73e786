-- extend: move the deadline of a valid lease to now + ttl, capped at
-- first-acquired + max_lease.
-- KEYS: 1 {P}:leases  2 {P}:owners  3 {P}:meta
-- ARGV: 1 id (1-64 chars of [A-Za-z0-9_-])  2 token (1-128 chars)
--       3 ttl_ms (integer 1-600000)  4 max_lease_ms (integer 1-86400000)
-- Returns: {1, deadline_ms, now_ms, capped} extended; capped = 1 when the
--          cap, not the ttl, set the deadline (if the cap is already
--          reached the deadline stays as it was);
--          {0, now_ms, 'not_owner' | 'expired'} and nothing changed, when
--          owners[id] is not the token or the deadline is not after now.
-- A lease without meta of its own (leased by a worker that knows only the
-- three keys) starts its cap now.
-- Errors: BADARG, KEYTYPE as in common.lua.

local leases, owners, meta = KEYS[1], KEYS[2], KEYS[3]
local _, err = pool_keys({ 'leases', 'owners', 'meta' })
if err then return err end
if #ARGV ~= 4 then
  return badarg('ARGV', 'id, token, ttl_ms, max_lease_ms')
end
local id, token = ARGV[1], ARGV[2]
err = name_arg('id', id) or token_arg(token)
if err then return err end
local ttl, max_lease
ttl, err = int_arg('ttl_ms', ARGV[3], 1, 600000)
if err then return err end
max_lease, err = int_arg('max_lease_ms', ARGV[4], 1, 86400000)
if err then return err end
err = key_types({ { leases, 'zset' }, { owners, 'hash' }, { meta, 'hash' } })
if err then return err end

local now = now_ms()
if redis.call('HGET', owners, id) ~= token then
  return { 0, now, 'not_owner' }
end
local deadline = tonumber(redis.call('ZSCORE', leases, id) or '0')
if deadline <= now then
  return { 0, now, 'expired' }
end

local first = lease_meta(meta, id, token)
if not first then
  first = now
  redis.call('HSET', meta, id, now .. ' 0 ' .. token)
end
local cap = first + max_lease
local wanted = now + ttl
if wanted <= cap then
  redis.call('ZADD', leases, wanted, id)
  return { 1, wanted, now, 0 }
end
if cap > now then
  redis.call('ZADD', leases, cap, id)
  return { 1, cap, now, 1 }
end
return { 1, deadline, now, 1 }
