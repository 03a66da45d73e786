-- enable: put disabled ids back into service. One that is not leased is due
-- when it was before it was disabled (a cooldown still running is kept),
-- else at once; a leased one returns to ready at its release or expiry.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled  5 {P}:parked
-- ARGV: 1.. ids (distinct)
-- Returns: the number of ids enabled (ids not disabled count 0).
-- Errors: NOID when an id is in none of ready, leases, owners, disabled;
--         BADARG, DUPID, KEYTYPE as in common.lua.

local K, err = check_admin_ids(1)
if err then return err end

local now = now_ms()
local count = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('SREM', K.disabled, id) == 1 then
    count = count + 1
    local due = tonumber(redis.call('HGET', K.parked, id) or now)
    redis.call('HDEL', K.parked, id)
    if not redis.call('ZSCORE', K.leases, id) then
      redis.call('ZADD', K.ready, 'NX', due, id)
    end
  end
end
return count
