-- Reserve timestamps up to a target for the holder of a worker ID (docs/mint-design.md,
-- "Reservation window"): the holder mints nothing above the mark this confirms.
--
-- KEYS[1]  lease key <prefix><app>:<id>
-- KEYS[2]  its high-water mark <prefix><app>:mark:{<lease key>} (see mark.lua)
-- KEYS[3]  its settled record <prefix><app>:settled:{<lease key>} (see mark.lua)
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  target: Unix ms to reserve up to (integer >= 0)
-- ARGV[3]  most lead over Redis' TIME a reservation may take, ms (integer >= 0): the target
--          is capped at TIME + this, so a local clock far ahead cannot push the mark (and
--          every later holder's floor) far into the future
-- ARGV[4]  rollback lead, ms (integer >= 0): --mint-window + --max-clock-skew; a mark this
--          node cannot vouch for is raised to TIME + this first (vouch.lua)
--
-- Returns {code, mark, time_ms}:
--   code     1  ours: the mark is now max(vouched mark, min(target, TIME + lead)), the
--               settled record deleted (from now on this holder may mint above it); 0  the
--               lease key does not hold our owner string: nothing written
--   mark     the mark after the call (when not ours: as stored, 0 when missing)
--   time_ms  Redis TIME in ms
--
-- Errors: a mark that is not an integer (written by hand): nothing written, no floor
local target = tonumber(ARGV[2])
local lead = tonumber(ARGV[3])
if target == nil or target < 0 or target ~= math.floor(target) then
  return redis.error_reply('ERR reserve: target must be an integer >= 0 (Unix ms)')
end
if lead == nil or lead < 0 or lead ~= math.floor(lead) then
  return redis.error_reply('ERR reserve: lead must be an integer >= 0 ms')
end
local rollback_lead, err = lead_arg(4, 'reserve')
if err then return err end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  local raw = redis.call('GET', KEYS[2])
  local stored = unstamp(raw)
  if raw and stored == nil then
    return redis.error_reply('ERR reserve: the mark ' .. KEYS[2] .. ' is not Unix ms (set by hand?); nothing written')
  end
  return {0, stored or 0, now}
end
local mark, _, bad = vouched_mark(now, rollback_lead, 'reserve')
if bad then return bad end
target = math.min(target, now + lead)
if target > mark then
  mark = target
  redis.call('SET', KEYS[2], stamped(mark))
end
redis.call('DEL', KEYS[3])
return {1, mark, now}
