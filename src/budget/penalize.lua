-- penalize: push keys of one budget back, after the target answered 429 or 503
-- with a Retry-After: no take is allowed before now + penalty_ms, and then the
-- budget refills at its rate from empty (a key already further back is kept).
-- KEYS: 1..n snowlease:budget:{<name>}:<key>, or {<pool>}:budget:<name>:<key> (the
--       keys a pool's acquire charges): one budget, one hash tag
-- ARGV: 1 penalty_ms, then for each key: rate_count, rate_period_ms, burst
-- Returns: {retry_after_ms, reset_after_ms, now_ms}: when a take of 1 is
--          allowed again, and when every key is full (and gone) again.
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
local tats
tats, err = budget_tats(KEYS, 1, now)
if err then return err end
local retry, reset = 0, 0
for i, l in ipairs(limits) do
  -- The TAT at which one unit is allowed at now + penalty, and no sooner.
  local tat = math.max(tats[i], now + penalty * 1000 + l.tau - l.interval)
  redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.max(budget_ms(tat - now), 1))
  retry = math.max(retry, tat + l.interval - l.tau - now)
  reset = math.max(reset, tat - now)
end
return { budget_ms(retry), budget_ms(reset), math.floor(now / 1000) }
