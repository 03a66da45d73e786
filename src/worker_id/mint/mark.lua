-- Read the floor a new holder of a worker ID mints above (docs/mint-design.md, "The mark"):
-- run after its claim, owner-checked, so every reservation of an earlier holder (each
-- owner-checked against the same lease key, which is ours now) is in the mark it reads.
--
-- KEYS[1]  lease key <prefix><app>:<id>
-- KEYS[2]  its high-water mark <prefix><app>:mark:{<lease key>}: Unix ms, no expiry, only
--          rises (reserve.lua, settle.lua)
-- KEYS[3]  its settled record <prefix><app>:settled:{<lease key>}: the last timestamp the
--          last holder minted, written at its release (settle.lua), deleted by the next
--          reservation (reserve.lua)
-- ARGV[1]  owner string "<identity>#<nonce>"
--
-- Returns {code, floor, mark, time_ms}:
--   code     1  the lease key holds our owner string; 0  it does not: floor and mark are 0,
--               nothing was read or written
--   floor    Unix ms every ID of ours must be above: the settled record when there is one
--            (nothing was reserved since that holder stopped), else the mark; 0 when none
--   mark     the mark, 0 when missing
--   time_ms  Redis TIME in ms
--
-- Errors: a mark that is not an integer (written by hand): nothing written, no floor
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0, 0, now}
end
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
if mark == nil then
  return redis.error_reply('ERR mark: the mark ' .. KEYS[2] .. ' is not Unix ms (set by hand?); nothing written')
end
local settled = tonumber(redis.call('GET', KEYS[3]) or '')
local floor = mark
if settled ~= nil then
  floor = settled
end
return {1, floor, mark, now}
