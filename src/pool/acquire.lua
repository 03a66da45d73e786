-- acquire: lease the first due id of the pool.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:fence  5 {P}:meta
--       6 {P}:disabled  7 {P}:requests  8 {P}:parked  9 {P}:quarantine
--       10 {P}:reasons
-- ARGV: 1 token  2 ttl_ms (at most max_lease_ms)
--       3 cooldown_ms for the expired leases reclaimed first
--       4 max_lease_ms: the lease's total cap, fixed now
--       [5 request_id for an idempotent retry]
-- Returns: {1, id, token, deadline_ms, fence, now_ms, replayed} when leased
--          (replayed = 1: the lease of an earlier call with this request id,
--          with that call's token and its current deadline, answered for as
--          long as that lease is valid);
--          {0, next_due_in_ms, now_ms} when no id is due, where
--          next_due_in_ms = -1 means no id will become due by itself;
--          {0, open_in_ms, now_ms, 1} when acquires are closed after Redis
--          restarted or failed over (it may have rolled back; see below):
--          nothing is leased or replayed for open_in_ms; 3 instead of 1 when
--          this call found the rollback and closed them;
--          {0, open_in_ms, now_ms, 2, record} when the pool is new (see
--          below): closed as after a rollback, and the caller may open it
--          once `record` is durable (lease/node_open.lua).
-- First it reclaims expired leases and ends quarantines whose time has
-- come (LIMITS.reclaim_per_acquire of each). A due id is leased only when
-- it is not disabled, not quarantined and nobody holds it (not in leases);
-- such entries of ready are dropped (release, expiry, the quarantine's end
-- or enable bring the id back).
-- Errors: BADARG, KEYTYPE as in common.lua; INFO refused (node.lua).
--
-- Rollback gate (node.lua's node_gate, docs/pool.md "After a Redis rollback"):
-- meta['~node'] (no id has a '~') holds "<max_lease_ms>:<open_at_ms>.<stamp>".
-- Redis restarted from an older snapshot or failed over to a lagging replica
-- may have lost leases (and fences) granted since, whose holders still use
-- their ids; it shows as a record of another node. Such a lease was granted
-- or extended before now and ends by its cap, at most max_lease after: so
-- nothing is leased (nor a lease replayed: it may have been released and
-- leased again since) until now + the largest max_lease_ms seen, and the
-- fence is lifted above every fence handed out before. A pool with no record
-- that never leased (fence 0, no leases) is new, or its first lease was lost
-- with a rollback to a snapshot older than it: closed the same way, until its
-- caller has made the record durable (init does the same).

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'fence', 'meta', 'disabled', 'requests', 'parked', 'quarantine', 'reasons',
})
if err then return err end
if #ARGV < 4 or #ARGV > 5 then
  return badarg('ARGV', 'token, ttl_ms, cooldown_ms, max_lease_ms [, request_id]')
end
local token, request_id = ARGV[1], ARGV[5]
err = token_arg(token) or (request_id and name_arg('request_id', request_id))
if err then return err end
local ttl, cooldown, max_lease
ttl, err = int_arg('ttl_ms', ARGV[2])
if err then return err end
cooldown, err = int_arg('cooldown_ms', ARGV[3])
if err then return err end
max_lease, err = int_arg('max_lease_ms', ARGV[4])
if err then return err end
if ttl > max_lease then
  return badarg('ttl_ms', 'at most max_lease_ms')
end
err = acquire_key_types(K)
if err then return err end

local now = now_ms()

local open_at, record, rolled_back, new_store, stored = node_gate(redis.call('HGET', K.meta, '~node'), max_lease, now, pool_active(K))
if record then redis.call('HSET', K.meta, '~node', record) end
if rolled_back then lift_fence(K.fence, now) end
if new_store then
  -- Opened by the first acquire that sees the record durable: come back soon.
  return { 0, math.min(open_at - now, 1000), now, 2, stored }
end
if open_at > now then
  -- 3: closed by this call (it found the rollback), for the caller to say so once.
  return { 0, open_at - now, now, rolled_back and 3 or 1 }
end

-- A retry of a call that leased: answer its lease while that is still valid.
local replayed, stale = replay_of(K, request_id, now)
if replayed then return replayed end
if stale then redis.call('HDEL', K.requests, request_id) end

reclaim(K, now, cooldown, LIMITS.reclaim_per_acquire)
end_quarantines(K, now, LIMITS.reclaim_per_acquire)

-- True when a ready entry may not be leased: disabled, quarantined, or
-- still held.
local function blocked(id)
  return redis.call('SISMEMBER', K.disabled, id) == 1 or redis.call('ZSCORE', K.leases, id) ~= false
      or redis.call('ZSCORE', K.quarantine, id) ~= false
end

-- Drops a blocked entry from ready; a disabled one that is neither leased
-- nor quarantined keeps its due time in parked.
local function drop(id, score)
  redis.call('ZREM', K.ready, id)
  if score > now and not redis.call('ZSCORE', K.leases, id) and not redis.call('ZSCORE', K.quarantine, id) then
    redis.call('HSET', K.parked, id, score)
  end
end

-- The earliest entry of `key` (a zset of due times) whose id is not
-- disabled, plus `extra` ms; scans LIMITS.hint_scan entries at most, past
-- that the last one seen bounds it (no id comes due before it).
local function earliest(key, extra)
  local chunk_size = LIMITS.scan_chunk
  for offset = 0, LIMITS.hint_scan - chunk_size, chunk_size do
    local chunk = redis.call('ZRANGE', key, offset, offset + chunk_size - 1, 'WITHSCORES')
    local last = offset + #chunk / 2 == LIMITS.hint_scan
    for i = 1, #chunk, 2 do
      if redis.call('SISMEMBER', K.disabled, chunk[i]) == 0 or (last and i == #chunk - 1) then
        return tonumber(chunk[i + 1]) + extra
      end
    end
    if #chunk < 2 * chunk_size then return nil end
  end
end

local id
for _ = 1, LIMITS.drops_per_acquire do
  local due = redis.call('ZRANGEBYSCORE', K.ready, '-inf', now, 'LIMIT', 0, 1, 'WITHSCORES')
  if not due[1] then break end
  if not blocked(due[1]) then
    id = due[1]
    redis.call('ZREM', K.ready, id)
    break
  end
  drop(due[1], tonumber(due[2]))
end

-- The earliest time an id that is not disabled comes due by itself: a
-- cooling id, a lease's deadline (+ the cooldown its reclaim gives), or a
-- quarantine's end. Blocked entries at the head of ready are dropped.
local function next_due()
  local best
  for _ = 1, LIMITS.hint_scan do
    local first = redis.call('ZRANGE', K.ready, 0, 0, 'WITHSCORES')
    if not first[1] then break end
    if not blocked(first[1]) then
      best = tonumber(first[2])
      break
    end
    drop(first[1], tonumber(first[2]))
  end
  for _, due in ipairs({ earliest(K.leases, cooldown) or false, earliest(K.quarantine, 0) or false }) do
    if due and (not best or due < best) then best = due end
  end
  return best
end

if not id then
  local best = next_due()
  if not best then
    return { 0, -1, now }
  end
  return { 0, math.max(best - now, 0), now }
end

local fence = redis.call('INCR', K.fence)
local deadline = now + ttl
drop_meta(K, id)
redis.call('HSET', K.owners, id, token)
redis.call('ZADD', K.leases, deadline, id)
redis.call('HSET', K.meta, id, meta_value(now, now + max_lease, fence, request_id or '.', token))
if request_id then
  redis.call('HSET', K.requests, request_id, request_value(fence, id, token))
end
return { 1, id, token, deadline, fence, now, 0 }
