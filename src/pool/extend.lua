-- extend: move the deadline of a valid lease to now + ttl, capped at the
-- lease's total cap: first-acquired + max lease, fixed at acquire and
-- stored in meta; an extend with a smaller max_lease_ms lowers it for good.
-- KEYS: 1 {P}:leases  2 {P}:owners  3 {P}:meta  4 {P}:requests
-- ARGV: 1 id  2 token
--       3 ttl_ms  4 max_lease_ms
-- Returns: {1, deadline_ms, now_ms, capped} extended; capped = 1 when the
--          cap, not the ttl, set the deadline (if the cap is already
--          reached the deadline stays as it was);
--          {0, now_ms, 'not_owner' | 'expired'} and nothing changed, when
--          owners[id] is not the token or the deadline is not after now.
-- A lease without meta of its own (leased by a worker that knows only the
-- three keys) gets its cap now: now + max_lease_ms.
-- Errors: BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({ 'leases', 'owners', 'meta', 'requests' })
if err then return err end
if #ARGV ~= 4 then
  return badarg('ARGV', 'id, token, ttl_ms, max_lease_ms')
end
local id, token = ARGV[1], ARGV[2]
err = name_arg('id', id) or token_arg(token)
if err then return err end
local ttl, max_lease
ttl, err = int_arg('ttl_ms', ARGV[3])
if err then return err end
max_lease, err = int_arg('max_lease_ms', ARGV[4])
if err then return err end
err = key_types({ { K.leases, 'zset' }, { K.owners, 'hash' }, { K.meta, 'hash' }, { K.requests, 'hash' } })
if err then return err end

local now = now_ms()
if redis.call('HGET', K.owners, id) ~= token then
  return { 0, now, 'not_owner' }
end
local deadline = tonumber(redis.call('ZSCORE', K.leases, id) or '0')
if deadline <= now then
  return { 0, now, 'expired' }
end

local first, cap, fence, rid = lease_meta(K.meta, id, token)
if not first then
  -- Meta of an earlier lease (reclaimed by a plain worker) goes, and the
  -- request entry that pointed at it.
  drop_meta(K, id)
  first, cap, fence, rid = now, now + max_lease, 0, '.'
  redis.call('HSET', K.meta, id, meta_value(first, cap, fence, rid, token))
elseif first + max_lease < cap then
  cap = first + max_lease
  redis.call('HSET', K.meta, id, meta_value(first, cap, fence, rid, token))
end
local wanted = now + ttl
if wanted <= cap then
  redis.call('ZADD', K.leases, wanted, id)
  return { 1, wanted, now, 0 }
end
if cap > now then
  redis.call('ZADD', K.leases, cap, id)
  return { 1, cap, now, 1 }
end
return { 1, deadline, now, 1 }
