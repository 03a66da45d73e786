-- enable: put disabled ids back into service. One that is neither leased
-- nor quarantined is due when it was before it was disabled (a cooldown
-- still running is kept), else at once; a leased one returns at its release
-- or expiry; a quarantined one at the quarantine's end. With force = 1 the
-- quarantine of each id (disabled or not) ends now too. Enabling an id
-- disabled by strikes clears its auto-disable record and its strikes.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled  5 {P}:parked
--       6 {P}:quarantine  7 {P}:reasons  8 {P}:strikes  9 {P}:autodisabled
-- ARGV: 1 force ('0' or '1')  2.. ids (distinct)
-- Returns: the number of ids enabled or whose quarantine force ended (ids
-- neither disabled nor, with force, quarantined count 0).
-- Errors: NOID when the pool does not know an id (see known in common.lua);
--         BADARG, DUPID, KEYTYPE as in common.lua.

if ARGV[1] ~= '0' and ARGV[1] ~= '1' then
  return badarg('force', "'0' or '1'")
end
local K, err = check_admin_ids(2)
if err then return err end

local now = now_ms()
local force = ARGV[1] == '1'
local count = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local changed = redis.call('SREM', K.disabled, id) == 1
  if changed then
    redis.call('HDEL', K.autodisabled, id)
    redis.call('HDEL', K.strikes, id)
  end
  if force and redis.call('ZREM', K.quarantine, id) == 1 then
    redis.call('HDEL', K.reasons, id)
    changed = true
  end
  if changed then
    count = count + 1
    if not redis.call('ZSCORE', K.leases, id) and not redis.call('ZSCORE', K.quarantine, id) then
      local due = parked_due(K, id, now)
      redis.call('HDEL', K.parked, id)
      redis.call('ZADD', K.ready, 'NX', due, id)
    end
  end
end
return count
