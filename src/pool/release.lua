-- release: hand a leased id back; it becomes due again after the cooldown,
-- or, with a quarantine, at the quarantine's end (the quarantine replaces
-- the cooldown). With strikes set in config, the max_strikes-th quarantine
-- of an id within strike_window_ms disables it (see autodisabled).
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:meta  5 {P}:disabled
--       6 {P}:requests  7 {P}:parked  8 {P}:quarantine  9 {P}:reasons
--       10 {P}:strikes  11 {P}:autodisabled  12 {P}:config
-- ARGV: 1 id  2 token  3 cooldown_ms  [4 quarantine_ms  5 reason]
-- Returns: {1, now_ms, quarantined_until_ms, strikes, auto_disabled}
--          released; without a quarantine the last three are 0 (a disabled
--          id stays out of ready, its cooldown kept in parked); strikes =
--          quarantines of the id within the window, this one included
--          (0 when strikes are off), auto_disabled = 1 when this one
--          disabled it;
--          {0, now_ms, 'not_owner' | 'expired'} and nothing changed, when
--          owners[id] is not the token or the deadline is not after now.
-- Errors: BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'meta', 'disabled', 'requests', 'parked',
  'quarantine', 'reasons', 'strikes', 'autodisabled', 'config',
})
if err then return err end
if #ARGV ~= 3 and #ARGV ~= 5 then
  return badarg('ARGV', 'id, token, cooldown_ms [, quarantine_ms, reason]')
end
local id, token, reason = ARGV[1], ARGV[2], ARGV[5]
err = name_arg('id', id) or token_arg(token) or (reason and reason_arg(reason))
if err then return err end
local cooldown, quarantine
cooldown, err = int_arg('cooldown_ms', ARGV[3])
if err then return err end
if ARGV[4] then
  quarantine, err = int_arg('quarantine_ms', ARGV[4])
  if err then return err end
end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.meta, 'hash' },
  { K.disabled, 'set' }, { K.requests, 'hash' }, { K.parked, 'hash' }, { K.quarantine, 'zset' },
  { K.reasons, 'hash' }, { K.strikes, 'hash' }, { K.autodisabled, 'hash' }, { K.config, 'hash' },
})
if err then return err end
local max_strikes = tonumber(redis.call('HGET', K.config, 'max_strikes') or '0')
local window = tonumber(redis.call('HGET', K.config, 'strike_window_ms') or '0')
if not max_strikes or not window then
  return fail('KEYTYPE', K.config .. ' hash integers')
end

local now = now_ms()
if redis.call('HGET', K.owners, id) ~= token then
  return { 0, now, 'not_owner' }
end
local deadline = redis.call('ZSCORE', K.leases, id)
if not deadline or tonumber(deadline) <= now then
  return { 0, now, 'expired' }
end

if not quarantine then
  end_lease(K, id, now, cooldown)
  return { 1, now, 0, 0, 0 }
end

redis.call('ZREM', K.leases, id)
redis.call('HDEL', K.owners, id)
drop_meta(K, id)
local until_ms = now + quarantine
redis.call('ZADD', K.quarantine, until_ms, id)
redis.call('HSET', K.reasons, id, reason)

-- Strikes: the quarantine times of this id within the window, this one too.
local count, auto = 0, 0
if max_strikes > 0 then
  local kept = {}
  for t in string.gmatch(redis.call('HGET', K.strikes, id) or '', '%d+') do
    if tonumber(t) > now - window then table.insert(kept, t) end
  end
  table.insert(kept, tostring(now))
  count = #kept
  if count >= max_strikes then
    auto = 1
    redis.call('SADD', K.disabled, id)
    redis.call('HSET', K.autodisabled, id, now .. ' ' .. count .. ' quarantines within ' .. window .. ' ms; last: ' .. reason)
    redis.call('HDEL', K.strikes, id)
  else
    redis.call('HSET', K.strikes, id, table.concat(kept, ' '))
  end
end
return { 1, now, until_ms, count, auto }
