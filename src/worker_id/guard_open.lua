-- Open an app's claim guard now (docs/worker.md, "Claim guard"): for first use, so
-- the first sidecars need not wait one TTL on a Redis that never held this
-- app's leases.
--
-- KEYS[1..n]  lease keys of IDs 0..n-1
-- KEYS[n+1]   claim guard of the app
-- ARGV[1]     "1": open even when lease keys exist (--force); "0": refuse
--
-- Returns {opened, at_ms, held}:
--   opened  1 = the guard now holds Redis' TIME (ms): claims are open;
--           0 = refused, nothing written (lease keys exist, or the guard
--           key has another type: held = -1)
--   at_ms   Redis time in ms when the script ran
--   held    how many lease keys exist (any type)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local guard_key = KEYS[#KEYS]
local guard_type = redis.call('TYPE', guard_key).ok
if guard_type ~= 'none' and guard_type ~= 'string' then
  return {0, now, -1}
end
local held = 0
for i = 1, #KEYS - 1 do
  held = held + redis.call('EXISTS', KEYS[i])
end
if held > 0 and ARGV[1] ~= '1' then
  return {0, now, held}
end
redis.call('SET', guard_key, now)
return {1, now, held}
