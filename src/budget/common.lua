-- common.lua (budget): GCRA helpers put in front of the budget scripts (and of
-- the pool's acquire with a charge), after the generated BUDGET_LIMITS table
-- (src/budget/limits.rs). Every name starts with budget_, so the helpers sit
-- beside the pool's common.lua in one script.
-- GCRA (generic cell rate algorithm): a key holds its TAT, the theoretical
-- arrival time in microseconds of Redis TIME; a rate of count per period gives
-- the emission interval T = period / count, a burst B the tolerance
-- tau = B * T. A charge of cost c is allowed when max(TAT, now) + c * T - tau
-- <= now; the key then holds the new TAT and expires when it is reached, which
-- is when the budget is full again (an idle key is gone).
-- Checks return an error table ({err = 'CODE detail'}) before any write:
--   BADARG <field> <expected>       a bad argument or key name
--   KEYTYPE <key> <found> number    a budget key that does not hold a sane TAT
-- (the pool's forms too: one decoder reads both, src/connection/script_error.rs)

local function budget_fail(code, detail)
  return { err = code .. ' ' .. detail }
end

local function budget_badarg(field, expected)
  return budget_fail('BADARG', field .. ' ' .. expected)
end

-- Redis TIME in microseconds (exact in a double until the year 2255), read once per script
-- (TIME moves on inside a script; one decision, one clock).
local BUDGET_NOW_US = nil
local function budget_now_us()
  if BUDGET_NOW_US == nil then
    local t = redis.call('TIME')
    BUDGET_NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return BUDGET_NOW_US
end

-- A decimal integer string within BUDGET_LIMITS[field] = {min, max}.
local function budget_int(field, value)
  local range = BUDGET_LIMITS[field]
  local expected = 'an integer ' .. range[1] .. '-' .. range[2]
  if type(value) ~= 'string' or not string.match(value, '^%d+$') or #value > 15 then
    return nil, budget_badarg(field, expected)
  end
  local n = tonumber(value)
  if n < range[1] or n > range[2] then
    return nil, budget_badarg(field, expected)
  end
  return n
end

-- The prefix of a budget's keys, from its first key: snowlease:budget:{<name>}:
-- (budget take) or {<pool>}:budget:<name>: (the keys a pool's acquire charges);
-- the budget name second. Nil for anything else.
local function budget_prefix(key)
  if type(key) ~= 'string' then return nil end
  local name = string.match(key, '^snowlease:budget:{([%w_%-]+)}:')
  if name and #name <= BUDGET_LIMITS.name_max then
    return 'snowlease:budget:{' .. name .. '}:', name
  end
  local pool, pname = string.match(key, '^{([%w_%-]+)}:budget:([%w_%-]+):')
  if pool and #pool <= BUDGET_LIMITS.name_max and #pname <= BUDGET_LIMITS.name_max then
    return '{' .. pool .. '}:budget:' .. pname .. ':', pname
  end
end

local BUDGET_NAME_RULE = '1-' .. BUDGET_LIMITS.name_max
    .. ' chars of [A-Za-z0-9_-] in keys snowlease:budget:{<name>}:<key> or {<pool>}:budget:<name>:<key>'

-- keys[first..] are budget keys: each prefix .. <key>, the key 1 to
-- BUDGET_LIMITS.key_max chars of [A-Za-z0-9_.:-], no key twice, as many as
-- BUDGET_LIMITS.keys allows.
local function budget_keys(keys, first, prefix)
  local n = #keys - first + 1
  local range = BUDGET_LIMITS.keys
  if n < range[1] or n > range[2] then
    return budget_badarg('keys', range[1] .. '-' .. range[2] .. ' keys per call')
  end
  local seen = {}
  for i = first, #keys do
    local key = keys[i]
    local rest = string.sub(key, 1, #prefix) == prefix and string.sub(key, #prefix + 1) or ''
    if #rest < 1 or #rest > BUDGET_LIMITS.key_max or not string.match(rest, '^[%w_%.:%-]+$') then
      return budget_badarg('keys[' .. (i - first) .. ']',
        prefix .. '<1-' .. BUDGET_LIMITS.key_max .. ' chars of [A-Za-z0-9_.:-]>')
    end
    if seen[key] then
      return budget_badarg('keys[' .. (i - first) .. ']', 'each key once')
    end
    seen[key] = true
  end
end

-- The limits of n keys from argv[first..]: per key rate_count,
-- rate_period_ms, burst. Returns a list of {interval = T, tau} in us, or nil
-- and an error.
local function budget_limits(argv, first, n)
  if #argv ~= first - 1 + 3 * n then
    return nil, budget_badarg('ARGV', 'rate_count, rate_period_ms, burst for each of the ' .. n .. ' keys')
  end
  local out = {}
  for i = 1, n do
    local at = first + 3 * (i - 1)
    local count, period, burst, err
    count, err = budget_int('rate_count', argv[at])
    if err then return nil, err end
    period, err = budget_int('rate_period_ms', argv[at + 1])
    if err then return nil, err end
    burst, err = budget_int('burst', argv[at + 2])
    if err then return nil, err end
    if count > period * 1000 then
      return nil, budget_badarg('rate_count', 'at most 1 per microsecond')
    end
    -- burst * period / count <= max without dividing: exact in a double
    -- (< 2^53 at the ranges' ends), the same comparison as limits.rs.
    if burst * period > BUDGET_LIMITS.window_ms[2] * count then
      return nil, budget_badarg('window_ms', 'burst / rate at most ' .. BUDGET_LIMITS.window_ms[2] .. ' ms')
    end
    out[i] = { interval = period * 1000 / count, tau = burst * period * 1000 / count, burst = burst }
  end
  return out
end

-- A stored value as the scripts write it: '<tat>' or '<tat>:<until>' (us, '%.3f' and
-- '%.0f'; until: a penalty, no take before it whatever the taker's limits), or nil:
-- tonumber alone takes nan, inf, 1e400, hex and negatives, and a nan or inf TAT would pass
-- the checks and fail a later SET halfway through the keys. A sane TAT or until is at most a
-- full window plus the longest penalty after now: the slack keeps a value readable that a node
-- whose clock ran ahead wrote (a failover, a clock stepped back); with none, a day-long
-- penalty from a clock 1 ms ahead was a bad key until it expired.
local function budget_stored_tat(v, now)
  if #v > 60 then return nil end
  local tat_text, until_text = string.match(v, '^(%d+%.?%d*):(%d+)$')
  if not tat_text then
    tat_text = string.match(v, '^%d+%.?%d*$')
  end
  if not tat_text then return nil end
  local tat = tonumber(tat_text)
  local latest = now + (BUDGET_LIMITS.window_ms[2] + BUDGET_LIMITS.penalty_ms[2]) * 1000
  if not tat or tat ~= tat or tat > latest then return nil end
  local until_us = 0
  if until_text then
    until_us = tonumber(until_text)
    if not until_us or until_us > latest then return nil end
  end
  return tat, until_us
end

-- The TAT each key holds for the caller's limits (now when absent or already passed; after a
-- penalty not before until + tau - T, so the first unit is due at until and the budget then
-- refills from empty at the caller's own rate), each key's penalty end (0: none) and its
-- stored TAT (now when absent), or nil and a KEYTYPE error. Every key is checked before the
-- caller writes any.
local function budget_tats(keys, first, now, limits)
  local tats, untils, raws = {}, {}, {}
  for i = first, #keys do
    local v = redis.pcall('GET', keys[i])
    if type(v) == 'table' then
      return nil, budget_fail('KEYTYPE', keys[i] .. ' ' .. redis.call('TYPE', keys[i]).ok .. ' number')
    end
    local tat, until_us
    if v then
      tat, until_us = budget_stored_tat(v, now)
      if not tat then
        return nil, budget_fail('KEYTYPE', keys[i] .. ' string number')
      end
    end
    local raw = math.max(tat or now, now)
    local eff = raw
    until_us = until_us or 0
    if until_us > 0 then
      local l = limits[i - first + 1]
      eff = math.max(eff, until_us + l.tau - l.interval)
    end
    tats[#tats + 1] = eff
    untils[#untils + 1] = until_us
    raws[#raws + 1] = raw
  end
  return tats, untils, raws
end

-- Half a microsecond of slack in time (T may be a fraction of a us), the
-- same in the allow decision and in remaining, so they never disagree.
local BUDGET_SLACK_US = 0.5

local function budget_ms(us)
  return math.max(math.ceil(us / 1000 - 1e-9), 0)
end

-- Whether cost may be charged to every key now, and if not, in how many us
-- it may (the longest wait over the keys). Writes nothing.
local function budget_verdict(limits, tats, cost, now)
  local retry, allowed = 0, true
  for i, l in ipairs(limits) do
    local wait = tats[i] + cost * l.interval - l.tau - now
    if wait > BUDGET_SLACK_US then
      allowed = false
      retry = math.max(retry, wait)
    end
  end
  return allowed, retry
end

-- Charges cost to every key (keys[first..]) when allowed, else to none.
-- Returns {allowed (0/1), remaining (the cost that could still be taken now,
-- the smallest over the keys), retry_after_ms (0 when allowed),
-- reset_after_ms (when every key is full again)}, ms rounded up.
local function budget_apply(keys, first, limits, tats, cost, now, allowed, retry)
  local remaining, reset = nil, 0
  for i, l in ipairs(limits) do
    local tat = tats[i]
    if allowed then
      -- Allowed means the penalty is served: a plain TAT from here on.
      tat = tat + cost * l.interval
      local ttl = math.max(budget_ms(tat - now), 1)
      redis.call('SET', keys[first + i - 1], string.format('%.3f', tat), 'PX', ttl)
    end
    -- The largest c that budget_verdict would allow now. The slack is
    -- time, not intervals: 1e-6 of an interval is 86 ms at 1/d.
    local left = math.floor((l.tau - (tat - now) + BUDGET_SLACK_US) / l.interval)
    left = math.min(math.max(left, 0), l.burst)
    remaining = remaining and math.min(remaining, left) or left
    reset = math.max(reset, tat - now)
  end
  return { allowed and 1 or 0, remaining, budget_ms(retry), budget_ms(reset) }
end

-- budget_verdict, then budget_apply: all keys or none.
local function budget_charge(keys, first, limits, tats, cost, now)
  local allowed, retry = budget_verdict(limits, tats, cost, now)
  return budget_apply(keys, first, limits, tats, cost, now, allowed, retry)
end

-- cost within BUDGET_LIMITS.cost and at most every key's burst.
local function budget_cost(value, limits)
  local cost, err = budget_int('cost', value)
  if err then return nil, err end
  for _, l in ipairs(limits) do
    if cost > l.burst then
      return nil, budget_badarg('cost', 'at most the burst (' .. l.burst .. ')')
    end
  end
  return cost
end
