-- The high-water mark as this node can vouch for it (docs/rollback-design.md, "Mint marks").
-- Put after node.lua and before mark.lua, reserve.lua and settle.lua, which share its keys:
-- KEYS[2] the mark, KEYS[3] the settled record.
--
-- A mark stamped by the node that runs the script, in this life, holds every reservation
-- made since it was written: a rollback would have changed the stamp. Any other mark (another
-- node's stamp, none, or no mark at all) may have lost reservations: Redis came back from an
-- older snapshot, or a replica that missed writes was promoted. No holder from before can have
-- reserved past its own Redis TIME + its lead, and that clock read at most the skew ahead of
-- this one, so the mark is raised to TIME + `rollback_lead` (the caller's --mint-window +
-- --max-clock-skew), the settled record dropped (it may predate a later holder's minting) and
-- the mark stamped. A worker ID that never minted pays the same once: its missing mark cannot
-- be told apart from one lost.

-- (mark, raised, err): the mark (Unix ms) after vouching and whether it was raised; or nil,
-- nil and an error reply for a mark that is not Unix ms (set by hand). `now`: Redis TIME (ms).
local function vouched_mark(now, rollback_lead, script)
  local raw = redis.call('GET', KEYS[2])
  local mark, stamp = unstamp(raw)
  if raw and mark == nil then
    return nil, nil, redis.error_reply('ERR ' .. script .. ': the mark ' .. KEYS[2]
      .. ' is not Unix ms (set by hand?); nothing written')
  end
  if stamped_here(stamp) then return mark, false end
  mark = math.max(mark or 0, now + rollback_lead)
  redis.call('SET', KEYS[2], stamped(mark))
  redis.call('DEL', KEYS[3])
  return mark, true
end

-- ARGV[n] as a lead in ms (integer >= 0), or nil and an error reply.
local function lead_arg(n, script)
  local lead = tonumber(ARGV[n])
  if lead == nil or lead < 0 or lead ~= math.floor(lead) then
    return nil, redis.error_reply('ERR ' .. script .. ': rollback lead must be an integer >= 0 ms')
  end
  return lead
end
