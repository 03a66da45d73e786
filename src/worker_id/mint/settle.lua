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
--
-- Returns {code, settled, mark}:
--   code     1  ours: the record is max(record, ARGV[2]) (a record still there means
--               nothing was reserved, so nothing minted, since it was written) and the mark
--               max(mark, ARGV[2]); 0  not ours: nothing written, settled 0
--   settled  the record after the call
--   mark     the mark after the call
--
-- Errors: a mark that is not an integer (written by hand): nothing written, no floor
local last = tonumber(ARGV[2])
if last == nil or last < 0 or last ~= math.floor(last) then
  return redis.error_reply('ERR settle: last must be an integer >= 0 (Unix ms)')
end
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
if mark == nil then
  return redis.error_reply('ERR settle: the mark ' .. KEYS[2] .. ' is not Unix ms (set by hand?); nothing written')
end
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0, mark}
end
local settled = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') or 0, last)
redis.call('SET', KEYS[3], string.format('%d', settled))
if last > mark then
  mark = last
  redis.call('SET', KEYS[2], string.format('%d', mark))
end
return {1, settled, mark}
