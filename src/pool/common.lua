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
-- Times are Redis TIME in ms; scores of ready/leases are ms too.
-- Argument rules, for every script's ARGV: pool names (in KEYS), ids and
-- request ids are names (1 to LIMITS.name_max chars of [A-Za-z0-9_-]); a
-- token is 1 to LIMITS.token_max bytes; an argument named like a LIMITS
-- range (ttl_ms, cooldown_ms, max_lease_ms, limit) is a decimal integer
-- within it; a list of ids holds LIMITS.ids of them.

local function fail(code, detail)
  return { err = code .. ' ' .. detail }
end

local function badarg(field, expected)
  return fail('BADARG', field .. ' ' .. expected)
end

-- The one clock: Redis TIME, in whole ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- The fence counter must be absent or a decimal integer INCR can raise.
local function fence_value(key)
  local v = redis.call('GET', key)
  if v and (not string.match(v, '^%d+$') or #v > 15) then
    return fail('KEYTYPE', key .. ' string integer')
  end
end

-- The checks of disable and enable: KEYS are ready, leases, owners,
-- disabled, parked of one pool with their types, ARGV[first..] a batch of
-- ids, and each id known to the pool (in ready, leases, owners or
-- disabled). Returns K (see pool_keys), or nil and an error.
local function check_admin_ids(first)
  local K, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled', 'parked' })
  if not K then return nil, err end
  err = ids_arg(first) or key_types({
    { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.disabled, 'set' }, { K.parked, 'hash' },
  })
  if err then return nil, err end
  for i = first, #ARGV do
    local id = ARGV[i]
    if not (redis.call('ZSCORE', K.ready, id) or redis.call('ZSCORE', K.leases, id)
        or redis.call('HEXISTS', K.owners, id) == 1 or redis.call('SISMEMBER', K.disabled, id) == 1) then
      return nil, fail('NOID', id)
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

local function meta_value(first, cap, fence, rid, token)
  return first .. ' ' .. cap .. ' ' .. fence .. ' ' .. rid .. ' ' .. token
end

-- requests[rid] = '<fence> <id> <token>': the lease an acquire with request
-- id rid got, kept while that lease lasts.
local function request_value(fence, id, token)
  return fence .. ' ' .. id .. ' ' .. token
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

-- Moves up to `limit` expired leases (deadline <= now) back to ready at
-- now + cooldown (disabled ones to parked). Returns their ids.
local function reclaim(K, now, cooldown, limit)
  local expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    end_lease(K, id, now, cooldown)
  end
  return expired
end
