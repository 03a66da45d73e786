-- common.lua: helpers put in front of every pool script (not a script alone).
-- Checks return an error table ({err = 'CODE detail'}) instead of raising, so
-- each script returns it before its first write. Error codes:
--   BADARG <field> <expected>           a bad argument or key name
--   KEYTYPE <key> <found> <expected>    a pool key of the wrong type (or a
--                                       fence that is not an integer)
--   POOLEXISTS <pool>                   init on a pool that has keys
--   DUPID <id>                          an id twice in one call, or already present
--   NOID <id>                           an id the pool does not know
-- Times are Redis TIME in ms; scores of ready/leases are ms too.

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

-- A decimal integer string (no sign, fraction or exponent) within [lo, hi].
local function int_arg(field, value, lo, hi)
  if type(value) ~= 'string' or not string.match(value, '^%d+$') or #value > 15 then
    return nil, badarg(field, 'an integer ' .. lo .. '-' .. hi)
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, badarg(field, 'an integer ' .. lo .. '-' .. hi)
  end
  return n
end

local function is_name(s)
  return type(s) == 'string' and #s >= 1 and #s <= 64 and string.match(s, '^[%w_%-]+$') ~= nil
end

local function name_arg(field, value)
  if not is_name(value) then
    return badarg(field, '1-64 chars of [A-Za-z0-9_-]')
  end
end

local function token_arg(value)
  if type(value) ~= 'string' or #value < 1 or #value > 128 then
    return badarg('token', '1-128 chars')
  end
end

-- ARGV[first..] is a batch of 1-1000 distinct valid ids.
local function ids_arg(first)
  local n = #ARGV - first + 1
  if n < 1 or n > 1000 then
    return badarg('ids', '1-1000 ids per call')
  end
  local seen = {}
  for i = first, #ARGV do
    local id = ARGV[i]
    if not is_name(id) then
      return badarg('ids[' .. (i - first) .. ']', '1-64 chars of [A-Za-z0-9_-]')
    end
    if seen[id] then
      return fail('DUPID', id)
    end
    seen[id] = true
  end
end

-- KEYS must be exactly {<pool>}:<suffix> for the given suffixes, in order.
local function pool_keys(suffixes)
  local pool = type(KEYS[1]) == 'string' and string.match(KEYS[1], '^{([%w_%-]+)}:') or nil
  local ok = pool ~= nil and #pool <= 64 and #KEYS == #suffixes
  if ok then
    for i, suffix in ipairs(suffixes) do
      if KEYS[i] ~= '{' .. pool .. '}:' .. suffix then
        ok = false
      end
    end
  end
  if not ok then
    return nil, badarg('pool', '1-64 chars of [A-Za-z0-9_-] in keys {<pool>}:' .. table.concat(suffixes, ',:'))
  end
  return pool
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
-- disabled of one pool with their types, ARGV a batch of ids, and each id
-- known to the pool (in one of the four keys). Returns an error or nil.
local function check_admin_ids()
  local ready, leases, owners, disabled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local _, err = pool_keys({ 'ready', 'leases', 'owners', 'disabled' })
  if err then return err end
  err = ids_arg(1)
  if err then return err end
  err = key_types({ { ready, 'zset' }, { leases, 'zset' }, { owners, 'hash' }, { disabled, 'set' } })
  if err then return err end
  for i = 1, #ARGV do
    local id = ARGV[i]
    if not (redis.call('ZSCORE', ready, id) or redis.call('ZSCORE', leases, id)
        or redis.call('HEXISTS', owners, id) == 1 or redis.call('SISMEMBER', disabled, id) == 1) then
      return fail('NOID', id)
    end
  end
end

-- meta[id] = '<first_acquired_ms> <fence> <token>' of the current lease;
-- returns first, fence when it belongs to this token, else nil.
local function lease_meta(meta, id, token)
  local v = redis.call('HGET', meta, id)
  if not v then
    return nil
  end
  local first, fence, owner = string.match(v, '^(%d+) (%d+) (.*)$')
  if not first or owner ~= token then
    return nil
  end
  return tonumber(first), tonumber(fence)
end

-- Ends the lease of `id`: out of leases, owners and meta, and back into
-- ready at now + cooldown unless it is disabled.
local function end_lease(ready, leases, owners, meta, disabled, id, now, cooldown)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', owners, id)
  redis.call('HDEL', meta, id)
  if redis.call('SISMEMBER', disabled, id) == 0 then
    redis.call('ZADD', ready, now + cooldown, id)
  end
end

-- Moves up to `limit` expired leases (deadline <= now) back to ready at
-- now + cooldown, or leaves disabled ones out of ready. Returns their ids.
local function reclaim(ready, leases, owners, meta, disabled, now, cooldown, limit)
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    end_lease(ready, leases, owners, meta, disabled, id, now, cooldown)
  end
  return expired
end

