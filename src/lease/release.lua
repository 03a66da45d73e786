-- Release leases: delete each key that still holds our owner string
-- (compare-and-delete; README, "Release"). At a stop every lease key of the
-- app is passed, so a claim that ran but whose reply never came is removed
-- too: the owner string is this process's own.
--
-- KEYS[1..n]  lease keys (one or more)
-- ARGV[1]     owner string
--
-- Returns  the number of keys deleted; 0: none held our owner string
--          (another owner, another type, or gone), nothing was written
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  end
end
return deleted
