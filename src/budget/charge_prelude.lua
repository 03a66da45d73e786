-- acquire_charged: the pool's acquire with a charge to a rate budget, in one
-- script: an id is leased only together with the charge, and charged only
-- with a lease. Built as: this prelude, node.lua, the pool's common.lua, the
-- budget's common.lua, acquire.lua as the function acquire_pool(), then charge.lua.
-- KEYS: the 10 keys of acquire.lua, then 1..n budget keys
--       {P}:budget:<name>:<key> (the pool's hash tag, one budget name)
-- ARGV: 1 n (the budget keys), 2 cost, then for each budget key rate_count,
--       rate_period_ms, burst; then the ARGV of acquire.lua
-- Returns: acquire.lua's replies ({1, ...} leased and charged, a replay of
--          an earlier charged lease, or {0, ...} nothing due, nothing
--          charged), or {2, retry_after_ms, now_ms, remaining,
--          reset_after_ms} when the budget denies (nothing leased).
-- Errors: BADARG, KEYTYPE as in both common.lua files; nothing is written.
-- acquire.lua and the pool helpers see only their own KEYS and ARGV (these
-- locals shadow the script's).

local CHARGE_N = tonumber(ARGV[1] or '')
if not CHARGE_N or CHARGE_N < 1 or CHARGE_N > #KEYS - 1 or CHARGE_N ~= math.floor(CHARGE_N) then
  return { err = 'BADARG ARGV n, cost, the budget limits, then the acquire arguments' }
end
local CHARGE_KEYS, CHARGE_ARGV, POOL_KEYS, POOL_ARGV = {}, {}, {}, {}
for i = 1, #KEYS do
  local into = i <= #KEYS - CHARGE_N and POOL_KEYS or CHARGE_KEYS
  into[#into + 1] = KEYS[i]
end
for i = 1, #ARGV do
  local into = i <= 2 + 3 * CHARGE_N and CHARGE_ARGV or POOL_ARGV
  into[#into + 1] = ARGV[i]
end
local KEYS, ARGV = POOL_KEYS, POOL_ARGV
