-- Record the worker IDs a sidecar claims from (--worker-ids) beside the app's lease keys, and
-- read what the app's other sidecars on this Redis recorded, so that ranges that overlap are
-- reported (docs/kubernetes.md, "Several clusters or regions"). Only a report: claims never
-- read it, so a lost or stale record costs a warning, never a lease.
--
-- KEYS[1]  <prefix><app>:ranges, a string of entries "<low>-<high>:<expires Redis ms>"
--          joined by ","; PX: until the latest entry expires
-- ARGV[1]  the caller's range "<low>-<high>"
-- ARGV[2]  how long the caller's entry lasts, ms (integer >= 1)
-- ARGV[3]  most entries kept (integer >= 1): the caller's, then the latest others
--
-- Returns {record, now}: the record as written (expired entries and the caller's old one
-- dropped, the caller's first) and Redis' TIME in ms.
local entry_ttl = tonumber(ARGV[2])
local most = tonumber(ARGV[3])
if entry_ttl == nil or entry_ttl < 1 or entry_ttl ~= math.floor(entry_ttl) then
  return redis.error_reply('ERR ranges: entry ttl must be an integer >= 1 ms')
end
if most == nil or most < 1 or most ~= math.floor(most) then
  return redis.error_reply('ERR ranges: most entries must be an integer >= 1')
end
if not string.match(ARGV[1], '^%d+%-%d+$') then
  return redis.error_reply('ERR ranges: range must be <low>-<high>')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local kept = {}
local latest_ms = 2 * 3600 * 1000
-- Sidecars write at most `most` entries (16) of at most 32 bytes ("1023-1023:<20 digits>,").
-- A value over 4096 bytes (128 such entries) was written by something else: parsing and
-- sorting it would block Redis for as long as it is long (0.7 s for 5 MB, timing out every
-- renewal on this Redis), so it is overwritten unparsed. GET, not STRLEN: the worker's ACL
-- rule (docs/operations.md) has +get and not +strlen; copying even 5 MB costs a few ms, the
-- parsing was what blocked. GET fails on another type as before.
local current = redis.call('GET', KEYS[1])
if current and #current > 4096 then current = false end
if current then
  for range, expires in string.gmatch(current, '(%d+%-%d+):(%d+)') do
    expires = tonumber(expires)
    -- Sidecars write entries for two TTLs, and --ttl is at most 1 h: a later expiry was
    -- written by hand and, always the latest, would be kept (and reported) for ever.
    local plausible = expires <= now + latest_ms
    if expires > now and plausible and range ~= ARGV[1] then kept[#kept + 1] = {range, expires} end
  end
end
-- Latest first, so the soonest to expire go when the record is full.
table.sort(kept, function(a, b) return a[2] > b[2] end)
while #kept >= most do table.remove(kept) end
table.insert(kept, 1, {ARGV[1], now + entry_ttl})

local parts = {}
local last = now
for i, entry in ipairs(kept) do
  parts[i] = entry[1] .. ':' .. string.format('%d', entry[2])
  if entry[2] > last then last = entry[2] end
end
local record = table.concat(parts, ',')
redis.call('SET', KEYS[1], record, 'PX', last - now)
return {record, now}
