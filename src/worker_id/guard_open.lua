-- Open claim guards now (docs/worker.md, "Claim guard"): for first use, so the
-- first sidecars need not wait one TTL on a Redis that never held this
-- app's leases.
--
-- KEYS        pairs: KEYS[2i-1] a lease key, KEYS[2i] its claim guard (as
--             claim.lua takes them: on one server every pair names the
--             app's guard; on Cluster one pair per call, both in one slot,
--             so the check of the lease key and the write are atomic)
-- ARGV[1]     "1": open even when lease keys exist or a guard is closed
--             (--force); "0": refuse then
-- ARGV[2]     lease keys the caller found outside KEYS (one server: IDs
--             beyond --max-worker-id), counted with `held`; "0" if none
-- ARGV[3]     the app's TTL, ms (--ttl): how long a guard written here stays
--             closed unless the caller opens it (below)
--
-- Returns {opened, at_ms, held, closed_ms, written} (written is
-- "" unless opened = 1):
--   opened     1 = every guard named is written closed until Redis' TIME +
--              ARGV[3] (`written`); the caller opens them once they are
--              durable (lease/node_open.lua); 2 = every guard named is already open (holds a time
--              not after now), with or without lease keys: nothing to do,
--              nothing written (so a deploy hook may run this on every
--              deploy);
--              3 = a guard named was written on another node or life of
--              Redis: Redis restarted or failed over since
--              and may have lost lease keys whose holders still publish, so
--              each such guard is written closed until Redis' TIME + ARGV[3]
--              (or its own later time) with this node's stamp, as a claim
--              would close it; closed_ms says how long. The app is not new:
--              nothing else to do (a deploy hook run after every restart of
--              Redis would otherwise fail until a sidecar claimed);
--              0 = refused, nothing written (lease keys exist and a guard
--              is missing, a guard is closed, or a guard key has another
--              type: held = -1)
--   at_ms      Redis time in ms when the script ran; with opened = 2 the
--              latest time a guard named opened
--   held       how many of the lease keys exist as strings (a key of
--              another type is no lease: sidecars never touch it), plus
--              ARGV[2]
--   closed_ms  ms until the latest closed guard opens, 0 when none is
--              closed. A closed guard was set by a claim that found it
--              missing: after a data loss, holders from before may still
--              publish their IDs until it opens, so only --force opens it
-- A guard written here holds "<now + ttl>.<node stamp>": closed, as a claim
-- that found no guard closes it, until the caller has seen it durable and
-- opened it. Why: a guard opened at once and then lost with a rollback (a
-- restart from a snapshot older than this call) looks new again, and this
-- command run again (a deploy hook) would open it while holders that claimed
-- behind the lost guard still publish their IDs.
if #KEYS == 0 or #KEYS % 2 ~= 0 then
  return redis.error_reply('ERR guard open: KEYS must be (lease key, guard) pairs')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local guards = {}
local held = tonumber(ARGV[2]) or 0
local closed = 0
local open_since = 0
local all_open = true
-- Guards written on another node or life of Redis, with their times.
local others = {}
for i = 1, #KEYS, 2 do
  if redis.call('TYPE', KEYS[i]).ok == 'string' then held = held + 1 end
  local guard = KEYS[i + 1]
  if not guards[guard] then
    local kind = redis.call('TYPE', guard).ok
    if kind ~= 'none' and kind ~= 'string' then
      return {0, now, -1, 0, ''}
    end
    local open_at, stamp = unstamp(redis.call('GET', guard))
    if open_at ~= nil and not stamped_here(stamp) then
      others[guard] = open_at
      all_open = false
    elseif open_at == nil or open_at > now then
      all_open = false
    elseif open_at > open_since then
      open_since = open_at
    end
    if open_at ~= nil and open_at > now and open_at - now > closed then
      closed = open_at - now
    end
    guards[guard] = true
  end
end
if ARGV[1] ~= '1' and all_open then
  return {2, open_since, held, 0, ''}
end
local ttl = tonumber(ARGV[3])
if ttl == nil or ttl < 1 then
  return redis.error_reply('ERR guard open: ARGV[3] must be the TTL in ms')
end
if next(others) ~= nil and ARGV[1] ~= '1' then
  local until_ms = now + ttl
  for guard, open_at in pairs(others) do
    until_ms = math.max(until_ms, open_at)
    redis.call('SET', guard, stamped(math.max(open_at, now + ttl)))
  end
  return {3, now, held, until_ms - now, ''}
end
if (held > 0 or closed > 0) and ARGV[1] ~= '1' then
  return {0, now, held, closed, ''}
end
local written = stamped(now + ttl)
for guard in pairs(guards) do
  redis.call('SET', guard, written)
end
return {1, now, held, closed, written}
