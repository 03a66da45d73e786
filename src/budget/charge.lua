-- charge.lua: the end of acquire_charged (see charge_prelude.lua).

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'fence', 'meta', 'disabled', 'requests', 'parked', 'quarantine', 'reasons',
})
if err then return err end
err = acquire_key_types(K)
if err then return err end
local in_pool = '{' .. K.pool_name .. '}:budget:'
local name = string.sub(CHARGE_KEYS[1], 1, #in_pool) == in_pool
    and string.match(string.sub(CHARGE_KEYS[1], #in_pool + 1), '^([%w_%-]+):') or nil
if not name or #name > BUDGET_LIMITS.name_max then
  return budget_badarg('budget', '1-' .. BUDGET_LIMITS.name_max .. ' chars of [A-Za-z0-9_-] in keys ' .. in_pool .. '<name>:<key>')
end
err = budget_keys(CHARGE_KEYS, 1, in_pool .. name .. ':')
if err then return err end
local limits, cost
limits, err = budget_limits(CHARGE_ARGV, 3, #CHARGE_KEYS)
if err then return err end
cost, err = budget_cost(CHARGE_ARGV[2], limits)
if err then return err end
local now = budget_now_us()
local tats
local untils
tats, untils = budget_tats(CHARGE_KEYS, 1, now, limits)
if not tats then return untils end

local allowed, retry = budget_verdict(limits, tats, cost, now)
if not allowed then
  -- A replay was charged when first granted: acquire.lua answers it, on the same test
  -- (replay_of) at the same time (now_ms() is read once per script).
  if replay_of(K, ARGV[5], now_ms()) then
    return acquire_pool()
  end
  local r = budget_apply(CHARGE_KEYS, 1, limits, tats, cost, now, false, retry)
  return { 2, r[3], math.floor(now / 1000), r[2], r[4] }
end
local reply = acquire_pool()
if type(reply) == 'table' and reply[1] == 1 and reply[7] == 0 then
  budget_apply(CHARGE_KEYS, 1, limits, tats, cost, now, true, 0)
end
return reply
