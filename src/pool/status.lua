-- status: counts of the pool's ids by state, and the quarantined and
-- auto-disabled ids with their reasons; never tokens.
-- KEYS: 1 {P}:ready  2 {P}:leases  3 {P}:owners  4 {P}:disabled
--       5 {P}:quarantine  6 {P}:reasons  7 {P}:autodisabled  8 {P}:meta
--       9 {P}:fence  10 {P}:requests
-- ARGV: none
-- Returns: {now_ms, ready_due, ready_cooling, leases_valid, leases_expired,
--           disabled, quarantined, auto_disabled,
--           n, (id, until_ms, reason, disabled)... n times,
--           m, (id, at_ms, reason)... m times,
--           d, id... d times (disabled ids, sorted),
--           l, (id, deadline_ms)... l times (leased ids, soonest deadline
--           first; expired ones included),
--           gate, closed_until_ms}
--          where ready_due have score <= now, leases_valid a deadline after
--          now, leases_expired one not yet reclaimed; disabled counts
--          disabled ids, leased or not; quarantined counts ids in
--          quarantine that are not disabled (precedence), auto_disabled the
--          ids strikes disabled. The lists hold the first
--          LIMITS.status_list_max quarantines (soonest end first; disabled =
--          1 for a disabled one), auto-disabled ids, disabled ids and
--          leases. gate says whether acquires are open, by the node record
--          as acquire.lua's node_gate would judge it now (read only: status
--          writes nothing, so a record the next acquire would rewrite is
--          reported, not changed):
--            'open'        leased as usual;
--            'closed'      this node's record, closed until closed_until_ms
--                          (Redis ms; -1 for every other gate): the next
--                          acquire after a rollback closed it, or a new pool
--                          where Redis would not say whether its first
--                          record is durable;
--            'new'         marked new (or no record in a pool that never
--                          leased): opens at the first acquire that sees its
--                          first record durable (docs/pool.md, "First use");
--            'rolled_back' a record of another node or an earlier life of
--                          this one (a restart, a failover), an unreadable
--                          one, or none in a pool that leased: the next
--                          acquire closes acquires for the largest max lease
--                          from then.
-- Errors: BADARG, KEYTYPE as in common.lua.

local K, err = pool_keys({
  'ready', 'leases', 'owners', 'disabled', 'quarantine', 'reasons', 'autodisabled', 'meta', 'fence', 'requests',
})
if err then return err end
if #ARGV ~= 0 then
  return badarg('ARGV', 'none')
end
err = key_types({
  { K.ready, 'zset' }, { K.leases, 'zset' }, { K.owners, 'hash' }, { K.disabled, 'set' },
  { K.quarantine, 'zset' }, { K.reasons, 'hash' }, { K.autodisabled, 'hash' }, { K.meta, 'hash' },
  { K.fence, 'string' }, { K.requests, 'hash' },
}) or fence_value(K.fence)
if err then return err end

local now = now_ms()
local due = redis.call('ZCOUNT', K.ready, '-inf', now)
local expired = redis.call('ZCOUNT', K.leases, '-inf', now)
local quarantine = redis.call('ZRANGE', K.quarantine, 0, -1, 'WITHSCORES')
local listed, quarantined = {}, 0
for i = 1, #quarantine, 2 do
  local id = quarantine[i]
  local disabled = redis.call('SISMEMBER', K.disabled, id)
  quarantined = quarantined + 1 - disabled
  if #listed < 4 * LIMITS.status_list_max then
    local reason = redis.call('HGET', K.reasons, id) or ''
    for _, v in ipairs({ id, tonumber(quarantine[i + 1]), reason, disabled }) do
      table.insert(listed, v)
    end
  end
end
local reply = {
  now, due, redis.call('ZCARD', K.ready) - due, redis.call('ZCARD', K.leases) - expired, expired,
  redis.call('SCARD', K.disabled), quarantined, redis.call('HLEN', K.autodisabled), #listed / 4,
}
for _, v in ipairs(listed) do
  table.insert(reply, v)
end
local auto = redis.call('HGETALL', K.autodisabled)
local m = math.min(#auto / 2, LIMITS.status_list_max)
table.insert(reply, m)
for i = 1, 2 * m, 2 do
  local at, text = string.match(auto[i + 1], '^(%d+) (.*)$')
  table.insert(reply, auto[i])
  table.insert(reply, tonumber(at or '0'))
  table.insert(reply, text or auto[i + 1])
end
local disabled = redis.call('SMEMBERS', K.disabled)
table.sort(disabled)
local d = math.min(#disabled, LIMITS.status_list_max)
table.insert(reply, d)
for i = 1, d do
  table.insert(reply, disabled[i])
end
local leases = redis.call('ZRANGE', K.leases, 0, LIMITS.status_list_max - 1, 'WITHSCORES')
table.insert(reply, #leases / 2)
for i = 1, #leases, 2 do
  table.insert(reply, leases[i])
  table.insert(reply, tonumber(leases[i + 1]))
end

-- The gate, judged as node_gate judges it (node.lua's judge_record), without its writes.
local function gate()
  local record = redis.call('HGET', K.meta, '~node')
  local kind, open_at = judge_record(record)
  if kind == 'lost' then
    -- Missing in a pool that never leased: new, as node_gate's new_store.
    if record == false and not pool_active(K) then return 'new', -1 end
    return 'rolled_back', -1
  end
  if kind == 'new' then return 'new', -1 end
  if open_at > now then return 'closed', open_at end
  return 'open', -1
end
local state, closed_until = gate()
table.insert(reply, state)
table.insert(reply, closed_until)
return reply
