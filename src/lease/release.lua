-- Release leases: each key that still holds our owner string is deleted,
-- or replaced by a tombstone (docs/worker.md, "Release", "ID handover"): a value
-- that is nobody's owner string, so claims treat the ID as held until it
-- expires. At a stop every lease key of the app is passed, so a claim that
-- ran but whose reply never came is released too: the owner string is this
-- process's own.
--
-- KEYS[1..n]  lease keys (one or more)
-- ARGV[1]     owner string
-- ARGV[2]     handover delay in ms: 0 deletes; >= 1 writes the tombstone
--             "released:<owner string>" expiring after that long
--
-- Returns  the number of keys released; 0: none held our owner string
--          (another owner, a tombstone, another type, or gone), nothing
--          was written
local delay = tonumber(ARGV[2])
if delay == nil or delay < 0 or delay ~= math.floor(delay) then
  return redis.error_reply('ERR release: handover delay must be an integer >= 0 ms')
end
local released = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    if delay > 0 then
      redis.call('SET', KEYS[i], 'released:' .. ARGV[1], 'PX', delay)
    else
      redis.call('DEL', KEYS[i])
    end
    released = released + 1
  end
end
return released
