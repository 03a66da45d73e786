-- penalize: hold keys of one budget back, after the target answered 429 or 503 with a
-- Retry-After: no take is allowed before now + penalty_ms, whatever limits the takers pass,
-- and then the budget refills from empty at each taker's own rate (the key stores the
-- penalty's end beside its TAT; a penalty already ending later is kept).
-- KEYS: 1..n snowlease:budget:{<name>}:<key>, or {<pool>}:budget:<name>:<key> (the
--       keys a pool's acquire charges): one budget, one hash tag
-- ARGV: 1 penalty_ms, then for each key: rate_count, rate_period_ms, burst (checked as a
--       take's; they set reset_after_ms. The key lives until the penalty's end plus the
--       longest window, 30 days, unless a take rewrites it: a taker with a longer window
--       than these limits still refills from empty)
-- Returns: {retry_after_ms, reset_after_ms, now_ms}: when a take is allowed again (the
--          penalty's end, the latest over the keys), and when every key is full (and gone)
--          again for the limits given.
-- Errors: BADARG, KEYTYPE as in common.lua; nothing is written then.

local prefix = budget_prefix(KEYS[1])
if not prefix then
  return budget_badarg('name', BUDGET_NAME_RULE)
end
local err = budget_keys(KEYS, 1, prefix)
if err then return err end
local penalty
penalty, err = budget_int('penalty_ms', ARGV[1])
if err then return err end
local limits
limits, err = budget_limits(ARGV, 2, #KEYS)
if err then return err end
local now = budget_now_us()
local tats, untils, raws = budget_tats(KEYS, 1, now, limits)
if not tats then return untils end
local retry, reset = 0, 0
for i, l in ipairs(limits) do
  local until_us = math.max(untils[i], now + penalty * 1000)
  -- The stored TAT stays the takers' own; the penalty's end rides beside it. The key lives
  -- until the budget is full again after the penalty for any taker: its refill from empty
  -- may take up to the longest window (burst / rate), whatever limits were given here.
  local full = math.max(raws[i], until_us + l.tau - l.interval)
  local ttl = math.max(budget_ms(math.max(full, until_us + BUDGET_LIMITS.window_ms[2] * 1000) - now), 1)
  redis.call('SET', KEYS[i], string.format('%.3f:%.0f', raws[i], until_us), 'PX', ttl)
  retry = math.max(retry, until_us - now)
  reset = math.max(reset, full - now)
end
return { budget_ms(retry), budget_ms(reset), math.floor(now / 1000) }
