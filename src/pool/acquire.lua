-- acquire: lease the first due id of the pool.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta  6 {P}:disabled
--       [7 {P}:req:<request_id>, only with ARGV[4]]
-- ARGV: 1 token (1-128 chars)  2 ttl_ms (integer 1-600000)
--       3 cooldown_ms (integer 0-600000) for the expired leases reclaimed first
--       [4 request_id (1-64 chars of [A-Za-z0-9_-]) for an idempotent retry]
-- Returns: {1, id, token, deadline_ms, fence, now_ms, replayed} when leased
--          (replayed = 1: the lease of an earlier call with this request id,
--          with that call's token);
--          {0, next_due_in_ms, now_ms} when no id is due, where
--          next_due_in_ms = -1 means no id will become due by itself.
-- Errors: BADARG, KEYTYPE as in common.lua.

local ready, leases, owners, fence_key, meta, disabled = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local suffixes = { 'ready', 'leases', 'owners', 'fence', 'meta', 'disabled' }
if #ARGV < 3 or #ARGV > 4 then
  return badarg('ARGV', 'token, ttl_ms, cooldown_ms [, request_id]')
end
local request_id = ARGV[4]
if request_id then
  local err = name_arg('request_id', request_id)
  if err then return err end
  table.insert(suffixes, 'req:' .. request_id)
end
local _, err = pool_keys(suffixes)
if err then return err end
local token = ARGV[1]
err = token_arg(token)
if err then return err end
local ttl, cooldown
ttl, err = int_arg('ttl_ms', ARGV[2], 1, 600000)
if err then return err end
cooldown, err = int_arg('cooldown_ms', ARGV[3], 0, 600000)
if err then return err end
local types = {
  { ready, 'zset' }, { leases, 'zset' }, { owners, 'hash' },
  { fence_key, 'string' }, { meta, 'hash' }, { disabled, 'set' },
}
if request_id then
  table.insert(types, { KEYS[7], 'string' })
end
err = key_types(types) or fence_value(fence_key)
if err then return err end

local now = now_ms()

-- A retry of a call that leased: answer its lease while that is still valid.
if request_id then
  local v = redis.call('GET', KEYS[7])
  local fence, id, old = string.match(v or '', '^(%d+) ([%w_%-]+) (.*)$')
  if id and redis.call('HGET', owners, id) == old then
    local deadline = tonumber(redis.call('ZSCORE', leases, id) or '0')
    if deadline > now then
      return { 1, id, old, deadline, tonumber(fence), now, 1 }
    end
  end
end

reclaim(ready, leases, owners, meta, disabled, now, cooldown, 100)

-- Skip (and drop from ready) ids that are disabled, or still leased against
-- the layout (their holder's release or expiry brings them back): a due id
-- is only leased when nobody holds it.
local id
for _ = 1, 100 do
  local due = redis.call('ZRANGEBYSCORE', ready, '-inf', now, 'LIMIT', 0, 1)[1]
  if not due then break end
  redis.call('ZREM', ready, due)
  if redis.call('SISMEMBER', disabled, due) == 0 and not redis.call('ZSCORE', leases, due) then
    id = due
    break
  end
end

if not id then
  -- Earliest of: a cooling id in ready, or a lease that expires (+ cooldown).
  local best
  local cooling = redis.call('ZRANGE', ready, 0, 9, 'WITHSCORES')
  for i = 1, #cooling, 2 do
    if redis.call('SISMEMBER', disabled, cooling[i]) == 0 then
      best = tonumber(cooling[i + 1])
      break
    end
  end
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  if first[2] then
    local due = tonumber(first[2]) + cooldown
    if not best or due < best then best = due end
  end
  if not best then
    return { 0, -1, now }
  end
  return { 0, math.max(best - now, 0), now }
end

local fence = redis.call('INCR', fence_key)
local deadline = now + ttl
redis.call('HSET', owners, id, token)
redis.call('ZADD', leases, deadline, id)
redis.call('HSET', meta, id, now .. ' ' .. fence .. ' ' .. token)
if request_id then
  redis.call('SET', KEYS[7], fence .. ' ' .. id .. ' ' .. token, 'PX', ttl)
end
return { 1, id, token, deadline, fence, now, 0 }
