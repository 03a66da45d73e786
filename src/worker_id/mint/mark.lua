-- Read the floor a new holder of a worker ID mints above (docs/mint-design.md, "The mark"):
-- run after its claim, owner-checked, so every reservation of an earlier holder (each
-- owner-checked against the same lease key, which is ours now) is in the mark it reads.
--
-- KEYS[1]  lease key <prefix><app>:<id>
-- KEYS[2]  its high-water mark <prefix><app>:mark:{<lease key>}: "<Unix ms>.<node stamp>"
--          (node.lua), no expiry, only rises (reserve.lua, settle.lua, vouch.lua)
-- KEYS[3]  its settled record <prefix><app>:settled:{<lease key>}: the last timestamp the
--          last holder minted, written at its release (settle.lua), deleted by the next
--          reservation (reserve.lua)
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  rollback lead, ms (integer >= 0): --mint-window + --max-clock-skew; a mark this
--          node cannot vouch for is raised to TIME + this (vouch.lua)
--
-- Returns {code, floor, mark, time_ms, raised}:
--   code     1  the lease key holds our owner string; 0  it does not: floor and mark are 0,
--               nothing was read or written
--   floor    Unix ms every ID of ours must be above: the settled record when there is one
--            (nothing was reserved since that holder stopped), else the mark
--   mark     the mark
--   time_ms  Redis TIME in ms
--   raised   1 when the mark was raised because this node could not vouch for it (a
--            rollback, a restart or failover, or a worker ID that never minted), else 0
--
-- Errors: a mark that is not an integer (written by hand): nothing written, no floor
local lead, err = lead_arg(2, 'mark')
if err then return err end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0, 0, now, 0}
end
local mark, raised, bad = vouched_mark(now, lead, 'mark')
if bad then return bad end
local settled = tonumber(redis.call('GET', KEYS[3]) or '')
local floor = mark
if settled ~= nil then
  floor = settled
end
return {1, floor, mark, now, raised and 1 or 0}
