-- Release a lease: delete the key only while it still holds our owner string
-- (compare-and-delete; README, "Release").
--
-- KEYS[1]  lease key
-- ARGV[1]  owner string
--
-- Returns  1  deleted
--          0  not ours (another owner, another type, or already gone);
--             nothing was written
local value = redis.pcall('GET', KEYS[1])
if value == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
