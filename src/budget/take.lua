-- take: charge cost to every key of one budget, all or nothing (GCRA on Redis TIME).
-- KEYS: 1..n snowlease:budget:{<name>}:<key>, or {<pool>}:budget:<name>:<key> (the
--       keys a pool's acquire charges): one budget, one hash tag
-- ARGV: 1 cost, then for each key: rate_count, rate_period_ms, burst
-- Returns: {allowed, remaining, retry_after_ms, reset_after_ms, now_ms}:
--          allowed 1 when every key was charged, 0 when none was;
--          remaining: the cost that could still be taken now (smallest over
--          the keys); retry_after_ms: when this charge would be allowed (0 when
--          allowed); reset_after_ms: when every key is full (and gone) again.
-- Every key written expires when its budget is full again.
-- Errors: BADARG, KEYTYPE as in common.lua; nothing is written then.

local prefix = budget_prefix(KEYS[1])
if not prefix then
  return budget_badarg('name', BUDGET_NAME_RULE)
end
local err = budget_keys(KEYS, 1, prefix)
if err then return err end
local limits, cost
limits, err = budget_limits(ARGV, 2, #KEYS)
if err then return err end
cost, err = budget_cost(ARGV[1], limits)
if err then return err end
local now = budget_now_us()
local tats
local untils
tats, untils = budget_tats(KEYS, 1, now, limits)
if not tats then return untils end
local reply = budget_charge(KEYS, 1, limits, tats, cost, now)
reply[5] = math.floor(now / 1000)
return reply
