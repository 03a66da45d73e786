-- disable: take ids out of service until enable. A ready id leaves ready at
-- once; a leased id stays leased, and its release or expiry leaves it out of
-- ready. Acquire skips disabled ids that a worker put back into ready.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
-- ARGV: 1.. ids, 1-1000 distinct ids of 1-64 chars of [A-Za-z0-9_-]
-- Returns: the number of ids newly disabled (already disabled ones count 0).
-- Errors: NOID when an id is in none of ready, leases, owners, disabled;
--         BADARG, DUPID, KEYTYPE as in common.lua.

local ready, disabled = KEYS[1], KEYS[4]
local err = check_admin_ids()
if err then return err end

local count = 0
for i = 1, #ARGV do
  count = count + redis.call('SADD', disabled, ARGV[i])
  redis.call('ZREM', ready, ARGV[i])
end
return count
