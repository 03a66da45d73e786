-- Claim the lowest free worker ID of a batch (docs/worker.md, "Claim").
--
-- KEYS        pairs, in ID order: KEYS[2i-1] the lease key of the i-th ID of
--             the batch, KEYS[2i] its claim guard. Several pairs may name
--             one guard: on one server every pair names the app's guard
--             <prefix><app>:guard; on Cluster each ID key has its own guard
--             <prefix><app>:guard:{<ID key>} in its slot, and the caller
--             sends one pair per call. A guard is a string without expiry
--             holding the Redis time (ms) from which new claims are allowed
-- ARGV[1]     owner string "<identity>#<nonce>"
-- ARGV[2]     TTL in milliseconds (integer >= 1)
-- ARGV[3]     optional, for a claim window of a larger range (one server,
--             docs/worker.md "Claim windows"): the worker ID of the first
--             pair (integer >= 0). KEYS then ends with one more key, the
--             app's claim hint <prefix><app>:hint: a string naming the ID
--             the last windowed claim took (PX: the TTL), read here and set
--             to the ID this call takes. Only a hint: a missing one or one
--             of another type (never touched) names none
-- ARGV[4]     optional, with ARGV[3]: the step between the worker IDs of
--             consecutive pairs (integer >= 1, default 1): pair i holds
--             worker ID ARGV[3] + (i - 1) * ARGV[4] (interleaved windows)
--
-- Returns {index, how, wrong, wait_ms, expires_ms, hint}:
--   index       0-based pair of the key now held by us, -1 when no key could
--               be taken and no guard is closed, -2 when no key could be
--               taken and at least one candidate's guard is closed
--   how         with index >= 0: 1 = claimed now with SET NX PX; 2 = already
--               ours (an earlier claim whose reply was lost ran after all;
--               TTL reset). With index -2, what the closed guards were: 1 =
--               a guard was missing and is set now (first use, or its data
--               was lost); 3 = a guard was written on another node (Redis
--               restarted or failed over since: it may have rolled back) and
--               is closed now; 2 = a guard was more than one TTL ahead and is
--               pulled in; 0 = closed as set before. Else 0
--   wrong       0-based pairs whose key has another type (never touched)
--   wait_ms     with index -2: ms until the soonest closed guard opens
--   expires_ms  TIME + ttl: when a key written now expires (see renew.lua);
--               the first renew derives its ARGV[3] from it
--   hint        with ARGV[3] and index -1: the ID the hint names, where a
--               free ID is likely (-1: none). Else -1
--
-- The guard: a guard missing where lease keys may have been (a fresh Redis,
-- a restart without persistence, FLUSHALL, a Cluster shard failed over to an
-- empty replica) means holders from before may still publish their IDs
-- until their own validity deadline, at most one TTL away, and re-create
-- their keys at their next renew. So the first claimant sets the guard to
-- now + TTL and nobody claims an ID behind it before then. Time is Redis'
-- TIME. A guard lives in the same failure domain as the keys it guards.
--
-- A guard holds "<open_at>.<node stamp>" (node.lua): a guard written on another node,
-- or with no stamp, may be older than the lease keys written since (a restart from an
-- older snapshot, a failover to a replica that missed writes: a rollback keeps the guard
-- and loses the newest leases). So it is closed for one TTL as a missing one is, and
-- stamped with this node (docs/rollback-design.md).
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR claim: ttl must be an integer >= 1 ms')
end
local first_id = nil
local hint_key = nil
if ARGV[3] ~= nil then
  first_id = tonumber(ARGV[3])
  if first_id == nil or first_id < 0 or first_id ~= math.floor(first_id) then
    return redis.error_reply('ERR claim: first worker ID must be an integer >= 0')
  end
  hint_key = KEYS[#KEYS]
end
local step = 1
if ARGV[4] ~= nil then
  step = tonumber(ARGV[4])
  if step == nil or step < 1 or step ~= math.floor(step) then
    return redis.error_reply('ERR claim: ID step must be an integer >= 1')
  end
end
local pair_keys = #KEYS - (hint_key and 1 or 0)
if pair_keys == 0 or pair_keys % 2 ~= 0 then
  return redis.error_reply('ERR claim: KEYS must be (lease key, guard) pairs')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = now + ttl
local pairs_n = pair_keys / 2

-- One read of every lease key: nil for a missing key and for a key of
-- another type alike (SET NX below tells them apart).
local ids = {}
for i = 1, pairs_n do ids[i] = KEYS[2 * i - 1] end
local values = redis.call('MGET', unpack(ids))

-- The hint's ID, or nil; a hint of another type is left alone.
local function read_hint()
  local value = redis.pcall('GET', hint_key)
  if type(value) == 'table' then return nil, false end
  return tonumber(value), true
end

-- Takes pair i: SET NX PX, and with a window the hint names its ID.
local function take(i)
  if not redis.call('SET', ids[i], ARGV[1], 'NX', 'PX', ttl) then return false end
  if hint_key then
    local _, writable = read_hint()
    if writable then redis.call('SET', hint_key, first_id + (i - 1) * step, 'PX', ttl) end
  end
  return true
end

for i = 1, pairs_n do
  if values[i] == ARGV[1] then
    -- Reset the TTL: validity is counted from this call's send time.
    redis.call('PEXPIRE', ids[i], ttl)
    return {i - 1, 2, {}, 0, expires, -1}
  end
end

-- When claims behind `key` open (Redis ms), and how this call found it.
-- Missing: set it. Written on another node (or by a version without
-- stamps): a rollback may have lost leases, so close it. Unreadable, or
-- further away than one TTL (written by hand, or Redis' clock went back):
-- no holder (one TTL for all sidecars of an app, see docs/worker.md) needs
-- more, so start one TTL from now instead.
local function read_guard(key)
  local guard = redis.pcall('GET', key)
  if type(guard) == 'table' and guard.err then
    return nil, 'ERR claim: ' .. key .. ' is not a string: ' .. guard.err
  end
  local open_at, stamp = unstamp(guard)
  local here = stamped_here(stamp)
  if open_at ~= nil and here and open_at <= now + ttl then
    return {open_at = open_at, how = 0}
  end
  redis.call('SET', key, stamped(now + ttl))
  local how = 2
  if guard == false then
    how = 1
  elseif open_at ~= nil and not here then
    how = 3
  end
  return {open_at = now + ttl, how = how}
end

-- Paused replies name the most telling guard: missing, then another node,
-- then too far (as GuardFound::more_telling ranks them; tests/it/claim_script.rs
-- compares the two for every pair of findings).
local rank = {[0] = 0, [1] = 3, [2] = 1, [3] = 2}
local guards = {}
local wrong = {}
local wait = nil
local paused_how = 0
for i = 1, pairs_n do
  if not values[i] then
    local key = KEYS[2 * i]
    local guard = guards[key]
    if guard == nil then
      local err
      guard, err = read_guard(key)
      if guard == nil then return redis.error_reply(err) end
      guards[key] = guard
    end
    if now < guard.open_at then
      if wait == nil or guard.open_at - now < wait then wait = guard.open_at - now end
      if rank[guard.how] > rank[paused_how] then paused_how = guard.how end
    elseif take(i) then
      return {i - 1, 1, wrong, 0, expires, -1}
    else
      -- MGET said nil, yet the key exists: another type.
      wrong[#wrong + 1] = i - 1
    end
  end
end
if wait ~= nil then
  return {-2, paused_how, wrong, wait, 0, -1}
end
local hint = nil
if hint_key then hint = read_hint() end
return {-1, 0, wrong, 0, 0, hint or -1}
