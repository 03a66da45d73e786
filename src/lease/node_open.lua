-- Opens a new store once its first record is durable (docs/rollback-design.md, "First
-- use"). A new store (node.lua's node_gate with new_store = true: a lock, a pool) is
-- written closed, as after a rollback, and marked new (NEW_RECORD), because a missing
-- record may be one a rollback lost. Once the caller has seen that record on every
-- replica and in the primary's persistence (persistence/durable.rs), no rollback can take
-- it away any more, so the store may open now: a later rollback brings the closed record
-- back with an old stamp, and it is seen. An app's claim guard written by `guard open` is
-- opened the same way (it carries no mark: claims read it by its time).
--
-- KEYS[1]  the key holding the record (a string, or a hash with the field ARGV[1])
-- KEYS[2]  optional: the store's fence counter, lifted when the record was written
-- ARGV[1]  hash field of the record, "" for a string key
-- ARGV[2]  the record as the caller read it: "[<bound_ms>:]<open_at_ms>.<stamp>[:new[:<n>]]"
-- ARGV[3]  what the fence counter goes back to: "" = deleted, else this integer
-- ARGV[4]  "durable": the caller saw the record durable: open it now;
--          "unchecked": Redis would not say: drop the mark, so that the record opens by
--          its time (one bound after the first use; a rollback that loses it leaves a
--          missing record whose next first use closes again, for one bound from then);
--          "withdraw": the caller gives up (not durable in time) and takes back what it
--          wrote, as if it had never run (`guard open`: a guard left closed would make
--          its next run refuse, and nothing was handed out under it)
--
-- Returns 1: opened now (the record holds Redis TIME, the fence counter reset: nothing
--            was handed out while the store was closed);
--         2: nothing written: a record without the mark opened by its time meanwhile
--            (fences may have been handed out from the lifted counter; it stays);
--         3: "unchecked": the mark dropped, the record opens by its time;
--         4: "withdraw": the record deleted;
--         0: nothing written, the record is not the one read (another caller changed it,
--            or Redis restarted or failed over since: its stamp is not this node's any
--            more; the store stays closed as written).
local function read()
  if ARGV[1] == '' then return redis.call('GET', KEYS[1]) end
  return redis.call('HGET', KEYS[1], ARGV[1])
end
local function write(record)
  if ARGV[1] == '' then
    redis.call('SET', KEYS[1], record)
  else
    redis.call('HSET', KEYS[1], ARGV[1], record)
  end
end
if read() ~= ARGV[2] then return 0 end
local record, prefix, rest, mark = read_record(ARGV[2])
local open_at, stamp = unstamp(rest)
if open_at == nil or not stamped_here(stamp) then return 0 end
if ARGV[4] == 'unchecked' then
  if mark then write(record) end
  return 3
end
if ARGV[4] == 'withdraw' then
  if ARGV[1] == '' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HDEL', KEYS[1], ARGV[1])
  end
  return 4
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if open_at <= now and not mark then return 2 end
write(prefix .. stamped(now))
if KEYS[2] then
  if ARGV[3] == '' then
    redis.call('DEL', KEYS[2])
  else
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
return 1
