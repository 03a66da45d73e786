-- disable: take ids out of service until enable. A ready id leaves ready at
-- once (a cooling one keeps its due time in parked, for enable); a leased id
-- stays leased, and its release or expiry leaves it out of ready; a
-- quarantined id stays in quarantine, and its end leaves it out of ready.
-- Acquire skips disabled ids that a worker put back into ready.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled  5 {P}:parked
--       6 {P}:quarantine  7 {P}:reasons  8 {P}:strikes  9 {P}:autodisabled
-- ARGV: 1.. ids (distinct)
-- Returns: the number of ids newly disabled (already disabled ones count 0).
-- Errors: NOID when the pool does not know an id (see known in common.lua);
--         BADARG, DUPID, KEYTYPE as in common.lua.

local K, err = check_admin_ids(1)
if err then return err end

local now = now_ms()
local count = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  count = count + redis.call('SADD', K.disabled, id)
  local due = redis.call('ZSCORE', K.ready, id)
  if due then
    redis.call('ZREM', K.ready, id)
    make_due(K, id, tonumber(due), now)
  end
end
return count
