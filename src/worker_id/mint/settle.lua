-- Record the last timestamp a stopping holder minted (docs/mint-design.md, "Release"), so
-- the next holder need not wait for the whole reservation to pass. Run after minting stopped
-- for good and before release.lua gives the lease key up. The mark is not lowered: the
-- record sits beside it, and the next reservation deletes it.
--
-- KEYS[1]  lease key <prefix><app>:<id>
-- KEYS[2]  its high-water mark <prefix><app>:mark:{<lease key>} (see mark.lua)
-- KEYS[3]  its settled record <prefix><app>:settled:{<lease key>} (see mark.lua)
-- ARGV[1]  owner string "<identity>#<nonce>"
-- ARGV[2]  the last minted timestamp, Unix ms (the floor this holder read, when it minted
--          nothing), integer >= 0
-- ARGV[3]  rollback lead, ms (integer >= 0): --mint-window + --max-clock-skew (vouch.lua)
--
-- Returns {code, settled, mark}:
--   code     1  ours: the mark is max(vouched mark, ARGV[2]) and, when this node could vouch
--               for the mark, the record max(record, ARGV[2]) (a record still there means
--               nothing was reserved, so nothing minted, since it was written); after a
--               rollback no record is written (the next floor is the raised mark);
--               0  not ours: nothing written, settled 0
--   settled  the record after the call (0: none)
--   mark     the mark after the call
--
-- Errors: a mark that is not an integer (written by hand): nothing written, no floor
local last = tonumber(ARGV[2])
if last == nil or last < 0 or last ~= math.floor(last) then
  return redis.error_reply('ERR settle: last must be an integer >= 0 (Unix ms)')
end
local rollback_lead, err = lead_arg(3, 'settle')
if err then return err end
local raw = redis.call('GET', KEYS[2])
local stored = unstamp(raw)
if raw and stored == nil then
  return redis.error_reply('ERR settle: the mark ' .. KEYS[2] .. ' is not Unix ms (set by hand?); nothing written')
end
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0, stored or 0}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local mark, raised = vouched_mark(now, rollback_lead, 'settle')
local settled = 0
if not raised then
  settled = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') or 0, last)
  redis.call('SET', KEYS[3], string.format('%d', settled))
end
if last > mark then
  mark = last
  redis.call('SET', KEYS[2], stamped(mark))
end
return {1, settled, mark}
