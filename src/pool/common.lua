-- common.lua: helpers put in front of every pool script (not a script alone),
-- after the generated LIMITS table (src/pool/limits.rs) they check against.
-- Checks return an error table ({err = 'CODE detail'}) instead of raising, so
-- each script returns it before its first write. Error codes:
--   BADARG <field> <expected>           a bad argument or key name
--   KEYTYPE <key> <found> <expected>    a pool key of the wrong type (or a
--                                       fence that is not an integer)
--   POOLEXISTS <pool>                   init on a pool that has keys
--   DUPID <id>                          an id twice in one call, or already present
--   NOID <id>                           an id the pool does not know
--   NOPOOL <pool>                       config of a pool that has no keys
-- Times are Redis TIME in ms; scores of ready/leases are ms too.
-- Argument rules, for every script's ARGV: pool names (in KEYS), ids and
-- request ids are names (1 to LIMITS.name_max chars of [A-Za-z0-9_-]); a
-- token is 1 to LIMITS.token_max bytes; a reason 0 to LIMITS.reason_max
-- bytes without control characters; an argument named like a LIMITS range
-- (ttl_ms, cooldown_ms, max_lease_ms, limit, quarantine_ms, max_strikes,
-- strike_window_ms) is a decimal integer within it; a list of ids holds
-- LIMITS.ids of them.
-- Admin states, by precedence: disabled > quarantined > cooling > ready.
-- A disabled id is never in ready (a cooldown or quarantine still running
-- is kept for enable); a quarantined id is in quarantine, in neither ready
-- nor leases, until its end moves it to ready (or, when disabled, leaves it
-- out); a lease is never cut short by an admin state.

local function fail(code, detail)
  return { err = code .. ' ' .. detail }
end

local function badarg(field, expected)
  return fail('BADARG', field .. ' ' .. expected)
end

-- The one clock: Redis TIME, in whole ms, read once per script. TIME moves on inside a
-- script, so two reads can disagree: a charged acquire judged a replay valid on one and the
-- acquire found it expired on the next, and leased a fresh id uncharged.
local NOW_MS = nil
local function now_ms()
  if NOW_MS == nil then
    local t = redis.call('TIME')
    NOW_MS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW_MS
end

-- The answer to a retry of an acquire with `request_id` (K: pool_keys, now: now_ms()):
-- its lease while still valid, {1, id, token, deadline_ms, fence, now_ms, 1}; else nil, and
-- whether a stale entry is left to remove. The one test every path that answers a replay
-- makes (acquire.lua, and the charge of acquire_charged, which must not charge it again).
local function replay_of(K, request_id, now)
  local v = request_id and redis.call('HGET', K.requests, request_id)
  if not v then return nil, false end
  local fence, id, old = string.match(v, '^(%d+) ([%w_%-]+) (.*)$')
  local deadline = id and tonumber(redis.call('ZSCORE', K.leases, id) or '0') or 0
  if id and redis.call('HGET', K.owners, id) == old and deadline > now then
    return { 1, id, old, deadline, tonumber(fence), now, 1 }, false
  end
  return nil, true
end

-- A decimal integer string (no sign, fraction or exponent) within
-- LIMITS[field] = {min, max}.
local function int_arg(field, value)
  local range = LIMITS[field]
  local lo, hi = range[1], range[2]
  if type(value) ~= 'string' or not string.match(value, '^%d+$') or #value > 15 then
    return nil, badarg(field, 'an integer ' .. lo .. '-' .. hi)
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, badarg(field, 'an integer ' .. lo .. '-' .. hi)
  end
  return n
end

local NAME_RULE = '1-' .. LIMITS.name_max .. ' chars of [A-Za-z0-9_-]'

local function is_name(s)
  return type(s) == 'string' and #s >= 1 and #s <= LIMITS.name_max and string.match(s, '^[%w_%-]+$') ~= nil
end

local function name_arg(field, value)
  if not is_name(value) then
    return badarg(field, NAME_RULE)
  end
end

local function token_arg(value)
  if type(value) ~= 'string' or #value < 1 or #value > LIMITS.token_max then
    return badarg('token', '1-' .. LIMITS.token_max .. ' chars')
  end
end

-- ARGV[first..] is a batch of distinct valid ids, as many as LIMITS.ids.
local function ids_arg(first)
  local n = #ARGV - first + 1
  if n < LIMITS.ids[1] or n > LIMITS.ids[2] then
    return badarg('ids', LIMITS.ids[1] .. '-' .. LIMITS.ids[2] .. ' ids per call')
  end
  local seen = {}
  for i = first, #ARGV do
    local id = ARGV[i]
    if not is_name(id) then
      return badarg('ids[' .. (i - first) .. ']', NAME_RULE)
    end
    if seen[id] then
      return fail('DUPID', id)
    end
    seen[id] = true
  end
end

local function reason_arg(value)
  if type(value) ~= 'string' or #value > LIMITS.reason_max or string.find(value, '%c') then
    return badarg('reason', 'at most ' .. LIMITS.reason_max .. ' bytes, no control characters')
  end
end

-- ARGV[i], ARGV[i + 1]: max_strikes and strike_window_ms, or 'off', 'off'.
-- Returns max, window (nil, nil for off), or nil, nil, an error.
local function strikes_args(i)
  if ARGV[i] == 'off' and ARGV[i + 1] == 'off' then
    return nil, nil, nil
  end
  local max, window, err
  max, err = int_arg('max_strikes', ARGV[i])
  if err then return nil, nil, err end
  window, err = int_arg('strike_window_ms', ARGV[i + 1])
  if err then return nil, nil, err end
  return max, window, nil
end

-- Writes the strike setting into config (off: removes it).
local function set_strikes(K, max, window)
  if max then
    redis.call('HSET', K.config, 'max_strikes', max, 'strike_window_ms', window)
  else
    redis.call('HDEL', K.config, 'max_strikes', 'strike_window_ms')
  end
end

-- KEYS must be exactly {<pool>}:<suffix> for the given suffixes, in order.
-- Returns K, a table suffix -> key name (and K.pool_name), or nil and an error.
local function pool_keys(suffixes)
  local pool = type(KEYS[1]) == 'string' and string.match(KEYS[1], '^{([%w_%-]+)}:') or nil
  local ok = is_name(pool) and #KEYS == #suffixes
  local K = { pool_name = pool }
  if ok then
    for i, suffix in ipairs(suffixes) do
      K[suffix] = KEYS[i]
      if KEYS[i] ~= '{' .. pool .. '}:' .. suffix then
        ok = false
      end
    end
  end
  if not ok then
    return nil, badarg('pool', NAME_RULE .. ' in keys {<pool>}:' .. table.concat(suffixes, ',:'))
  end
  return K
end

-- Each key must be absent or of its type ('zset', 'hash', 'set', 'string').
local function key_types(spec)
  for _, s in ipairs(spec) do
    local found = redis.call('TYPE', s[1]).ok
    if found ~= 'none' and found ~= s[2] then
      return fail('KEYTYPE', s[1] .. ' ' .. found .. ' ' .. s[2])
    end
  end
end

-- The fence counter must be absent or a decimal integer INCR can raise
-- that Lua still holds exactly (below 2^53; a fence lifted after a rollback
-- is Redis time in us, 16 digits).
local function fence_value(key)
  local v = redis.call('GET', key)
  if v and (not string.match(v, '^%d+$') or #v > 16 or tonumber(v) >= 9007199254740992) then
    return fail('KEYTYPE', key .. ' string integer')
  end
end

-- The types of acquire.lua's keys (K: its pool_keys), checked before any of
-- them is read: also by charge.lua, whose replay test reads requests, leases
-- and owners before acquire.lua runs (a read of a key of another type raises
-- WRONGTYPE, which names no key).
local function acquire_key_types(K)
  return key_types({
    { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.fence, 'string' },
    { K.meta, 'hash' }, { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' },
    { K.quarantine, 'zset' }, { K.reasons, 'hash' },
  }) or fence_value(K.fence)
end

-- True when the pool knows `id`: in ready, leases, owners, disabled or
-- quarantine (K needs those keys).
local function known(K, id)
  return redis.call('ZSCORE', K.ready, id) or redis.call('ZSCORE', K.leases, id)
      or redis.call('HEXISTS', K.owners, id) == 1 or redis.call('SISMEMBER', K.disabled, id) == 1
      or redis.call('ZSCORE', K.quarantine, id)
end

-- The checks of disable and enable: KEYS are ready, leases, owners,
-- disabled, parked, quarantine, reasons, strikes, autodisabled of one pool
-- with their types, ARGV[first..] a batch of ids, each known to the pool.
-- Returns K (see pool_keys), or nil and an error.
local function check_admin_ids(first)
  local K, err = pool_keys({
    'ready', 'leases', 'owners', 'disabled', 'parked', 'quarantine', 'reasons', 'strikes', 'autodisabled',
  })
  if not K then return nil, err end
  err = ids_arg(first) or key_types({
    { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.disabled, 'set' },
    { K.parked, 'hash' }, { K.quarantine, 'zset' }, { K.reasons, 'hash' }, { K.strikes, 'hash' },
    { K.autodisabled, 'hash' },
  })
  if err then return nil, err end
  for i = first, #ARGV do
    if not known(K, ARGV[i]) then
      return nil, fail('NOID', ARGV[i])
    end
  end
  return K
end

-- meta[id] = '<first_acquired_ms> <cap_ms> <fence> <request_id or .> <token>'
-- of the current lease: cap_ms is the latest deadline extend may set, fixed
-- at acquire. Returns first, cap, fence, request_id ('.' for none) when the
-- entry belongs to this token, else nil.
local function lease_meta(meta, id, token)
  local v = redis.call('HGET', meta, id)
  if not v then
    return nil
  end
  local first, cap, fence, rid, owner = string.match(v, '^(%d+) (%d+) (%d+) ([%w_%-%.]+) (.*)$')
  if not first or owner ~= token then
    return nil
  end
  return tonumber(first), tonumber(cap), tonumber(fence), rid
end

-- Numbers as '%.0f': Lua's own tostring gives 16-digit fences as 1.7e+15.
local function meta_value(first, cap, fence, rid, token)
  return string.format('%.0f %.0f %.0f ', first, cap, fence) .. rid .. ' ' .. token
end

-- requests[rid] = '<fence> <id> <token>': the lease an acquire with request
-- id rid got, kept while that lease lasts.
local function request_value(fence, id, token)
  return string.format('%.0f ', fence) .. id .. ' ' .. token
end

-- Drops meta[id] and the request entry that points at that lease.
local function drop_meta(K, id)
  local v = redis.call('HGET', K.meta, id)
  if not v then return end
  local _, _, fence, rid, token = string.match(v, '^(%d+) (%d+) (%d+) ([%w_%-%.]+) (.*)$')
  if rid and rid ~= '.' and redis.call('HGET', K.requests, rid) == request_value(fence, id, token) then
    redis.call('HDEL', K.requests, rid)
  end
  redis.call('HDEL', K.meta, id)
end

-- The due time kept in parked for `id`, or `default` (also for a value
-- that is not a number: never a reason to fail halfway).
local function parked_due(K, id, default)
  return tonumber(redis.call('HGET', K.parked, id) or '') or default
end

-- Puts `id` (in no other key) where it is due at `due`: into ready, or,
-- when it is disabled, into parked so enable keeps a cooldown still running.
local function make_due(K, id, due, now)
  if redis.call('SISMEMBER', K.disabled, id) == 1 then
    if due > now then
      redis.call('HSET', K.parked, id, due)
    end
  else
    redis.call('ZADD', K.ready, due, id)
  end
end

-- Ends the lease of `id`: out of leases, owners, meta and requests, and due
-- again at now + cooldown (see make_due).
local function end_lease(K, id, now, cooldown)
  redis.call('ZREM', K.leases, id)
  redis.call('HDEL', K.owners, id)
  drop_meta(K, id)
  make_due(K, id, now + cooldown, now)
end

-- Ends up to `limit` quarantines whose time has come (until <= now): each
-- id is due at its end (or at a later cooldown kept in parked); a disabled
-- one stays out of ready. Returns how many ended.
local function end_quarantines(K, now, limit)
  local ended = redis.call('ZRANGEBYSCORE', K.quarantine, '-inf', now, 'LIMIT', 0, limit, 'WITHSCORES')
  for i = 1, #ended, 2 do
    local id = ended[i]
    local due = math.max(tonumber(ended[i + 1]), parked_due(K, id, 0))
    redis.call('ZREM', K.quarantine, id)
    redis.call('HDEL', K.reasons, id)
    redis.call('HDEL', K.parked, id)
    make_due(K, id, due, now)
  end
  return #ended / 2
end

-- Moves up to `limit` expired leases (deadline <= now) back to ready at
-- now + cooldown (disabled ones to parked). Returns their ids.
local function reclaim(K, now, cooldown, limit)
  local expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    end_lease(K, id, now, cooldown)
  end
  return expired
end

-- Whether the pool shows a past use (a fence handed out, leases or their owners and
-- request ids kept): a missing node record then means a use a rollback lost, not a new pool
-- (node.lua's node_gate `active`; acquire and status judge it alike).
local function pool_active(K)
  return tonumber(redis.call('GET', K.fence) or '0') > 0
      or redis.call('EXISTS', K.leases, K.owners, K.requests) > 0
end
