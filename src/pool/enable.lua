-- enable: put disabled ids back into service. One that is not leased is due
-- at once; a leased one returns to ready at its release or expiry.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
-- ARGV: 1.. ids, 1-1000 distinct ids of 1-64 chars of [A-Za-z0-9_-]
-- Returns: the number of ids enabled (ids not disabled count 0).
-- Errors: NOID when an id is in none of ready, leases, owners, disabled;
--         BADARG, DUPID, KEYTYPE as in common.lua.

local ready, leases, disabled = KEYS[1], KEYS[2], KEYS[4]
local err = check_admin_ids()
if err then return err end

local now = now_ms()
local count = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('SREM', disabled, id) == 1 then
    count = count + 1
    if not redis.call('ZSCORE', leases, id) then
      redis.call('ZADD', ready, 'NX', now, id)
    end
  end
end
return count
