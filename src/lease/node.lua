-- Node stamps: how a script sees that Redis rolled back (docs/rollback-design.md).
-- Prepended to every script that hands out something a rollback could hand out twice
-- (claim, guard open, the mint marks, pool acquire, lock acquire).
--
-- A node stamp names the server process and its replication history: 15 decimal digits
-- of SHA1(run_id .. ':' .. master_replid), with ':' .. n appended when n > 0 REPLICAOF
-- (SLAVEOF) commands ran on it (INFO server, INFO replication, INFO commandstats). run_id
-- is new at every start of redis-server (so a restart from an older RDB or AOF changes
-- it), master_replid at every promotion of a replica (so a failover, also back to a node
-- that was primary before and demoted in between, changes it), and the REPLICAOF count at
-- every promotion Sentinel makes (it sends REPLICAOF NO ONE to the node it promotes, in
-- the same MULTI that kills its clients): a failover back to a primary that was never
-- demoted keeps run_id and master_replid, as REPLICAOF NO ONE changes nothing on a
-- primary, but not the count (docs/rollback-design.md). A value written with the stamp of the node
-- that runs this script now was written on this node in this life: no rollback can have
-- taken its later writes away without changing the stamp. Any other stamp, or none, means
-- the value may be older than what was handed out: the caller treats it as after a loss.
--
-- Stamped values read as numbers by older versions: "<integer>.<stamp>" (the stamp in
-- the place of a fraction), so tonumber() of an old sidecar still gets the integer part.
-- Errors: a server whose INFO shows no run_id or master_replid (nothing could be seen).

local node_stamp_memo = nil

-- How many REPLICAOF (or SLAVEOF, its old name) commands ran on this node since its start
-- or the last CONFIG RESETSTAT (INFO commandstats; renamed commands count under their
-- own name).
local function replicaof_calls()
  local stats = redis.call('INFO', 'commandstats')
  local n = 0
  for _, name in ipairs({'slaveof', 'replicaof'}) do
    n = n + (tonumber(string.match(stats, 'cmdstat_' .. name .. ':calls=(%d+)')) or 0)
  end
  return n
end

-- The stamp of the node that runs this script; INFO is read once per script (three INFO
-- sections cost about 60 us of Redis time, so callers ask only on the paths that hand out).
local function node_stamp()
  if node_stamp_memo then return node_stamp_memo end
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  if not run_id or not replid then
    error({err = 'ERR node: INFO shows no run_id or master_replid, so a rollback could not be seen'})
  end
  local calls = replicaof_calls()
  if calls > 0 then replid = replid .. ':' .. calls end
  local digest = redis.sha1hex(run_id .. ':' .. replid)
  node_stamp_memo = string.format('%015.0f', tonumber(string.sub(digest, 1, 12), 16))
  return node_stamp_memo
end

-- Splits a stored "<integer>.<stamp>" into (integer, stamp); a plain integer gives
-- (integer, nil), anything else (nil, nil). `value` may be false (a missing key).
local function unstamp(value)
  if type(value) ~= 'string' then return nil, nil end
  local int, stamp = string.match(value, '^(%-?%d+)%.(%d+)$')
  if int then return tonumber(int), stamp end
  int = string.match(value, '^%-?%d+$')
  if int then return tonumber(int), nil end
  return nil, nil
end

-- "<integer>.<stamp of this node>".
local function stamped(int)
  return string.format('%d.%s', int, node_stamp())
end

-- Whether `stamp` (from unstamp) is this node's: false for nil.
local function stamped_here(stamp)
  return stamp ~= nil and stamp == node_stamp()
end

-- Node gates: the record a store that hands out leases and fences keeps (pool acquire,
-- lock acquire), "<bound_ms>:<open_at_ms>.<stamp>": the longest lease any caller said its
-- holders may have (ms), and when hand-outs open (Redis ms), stamped by the node that
-- wrote it.
--
-- node_gate(record, bound, now, active) -> open_at, new_record, rolled_back, new_store, stored
--   (stored: with new_store, the record as it is now stored, for node_open.lua)
--   record   the stored record, or false (missing)
--   bound    this caller's longest lease, ms (pool: max_lease_ms, lock: the TTL)
--   now      Redis TIME, ms
--   active   whether the store shows it ever handed something out (a fence, leases)
-- A record of this node opens at its open_at. A record of another node (or life), an
-- unreadable one, or a missing one in a store that shows activity may predate leases that
-- a rollback lost and whose holders still run: each of those was last granted or renewed
-- before now, for at most the longest bound any caller used, so it ends by now + that
-- bound. Until then nothing may be handed out (open_at = now + bound) and the caller must
-- lift its fence (lift_fence).
-- A missing record in a store that shows no activity is a new store, or one whose first
-- use a rollback lost with everything else (a snapshot older than that use): nothing
-- tells the two apart. So it is closed the same way, the fence lifted too, and marked new
-- (new_mark() at its end): new_store = true, for this caller and every later one while
-- the mark stays. A new record never opens by its time: only a caller that saw it durable
-- opens it (node_open.lua), after which no rollback can lose it (a later one brings it
-- back with an old stamp, and it is seen); one that could not check durability (Redis
-- refuses to say) drops the mark, and the record opens by its time. Why never by time
-- otherwise: a record opened so and lost with a rollback leaves a missing record again,
-- whose next first use, durable at once, would open at once while a holder from before
-- still runs. new_record is nil when nothing changes.
local NEW_RECORD = ':new'

-- The new-store mark: NEW_RECORD, then ':<n>' where INFO persistence counts n snapshots
-- (rdb_saves, Redis 7+: counted when a snapshot's child forks) now. Any snapshot counted
-- after n started after the record, so a later caller that waits for the record to be
-- durable (persistence/durable.rs) takes one that an earlier caller's BGSAVE started as
-- its own: waits that each end before a long snapshot finishes still add up.
local function new_mark()
  local saves = string.match(redis.call('INFO', 'persistence'), 'rdb_saves:(%d+)')
  if saves then return NEW_RECORD .. ':' .. saves end
  return NEW_RECORD
end

-- Splits a stored record "[<bound_ms>:]<open_at_ms>.<stamp>[:new[:<n>]]" (a guard has no
-- bound) into (record without the mark, bound prefix "<bound_ms>:" or "", the rest, the
-- mark or nil).
local function read_record(record)
  local mark = string.match(record, '(' .. NEW_RECORD .. ':%d+)$')
    or string.match(record, '(' .. NEW_RECORD .. ')$')
  if mark then record = string.sub(record, 1, -#mark - 1) end
  local prefix, rest = string.match(record, '^(%d+:)(.+)$')
  if not prefix then prefix, rest = '', record end
  return record, prefix, rest, mark
end

-- How node_gate judges a stored store record (`record`: the stored text, or false when
-- missing), writing nothing (pool status reads the gate through it):
-- judge_record(record) -> kind, open_at, known, bare, mark
--   kind     'here': this node's, in this life: hand-outs open at open_at (Redis ms);
--            'new': this node's, marked new: opens only once seen durable (node_open.lua);
--            'lost': missing, unreadable (a store record has a bound), or of another node
--            or life: may predate leases a rollback lost
--   known    the largest bound the record names, ms (0 without one)
--   bare     the record without its mark; mark the mark, or nil
local function judge_record(record)
  if type(record) ~= 'string' then return 'lost', nil, 0, record, nil end
  local bare, prefix, rest, mark = read_record(record)
  local known = tonumber(string.match(prefix, '^(%d+)'))
  if not known then return 'lost', nil, 0, bare, mark end
  local open_at, stamp = unstamp(rest)
  if open_at == nil or not stamped_here(stamp) then return 'lost', nil, known, bare, mark end
  if mark then return 'new', open_at, known, bare, mark end
  return 'here', open_at, known, bare, mark
end

local function node_gate(record, bound, now, active)
  local kind, open_at, known, bare, mark = judge_record(record)
  local widest = math.max(bound, known)
  if kind == 'new' then
    return now + widest, nil, false, true, bare .. mark
  end
  if kind == 'here' then
    if bound > known then
      return open_at, string.format('%d:%s', widest, stamped(open_at)), false, false
    end
    return open_at, nil, false, false
  end
  open_at = now + widest
  local new_store = record == false and not active
  local written = string.format('%d:%s', widest, stamped(open_at))
  if new_store then written = written .. new_mark() end
  return open_at, written, true, new_store, written
end

-- Raises the fence counter at `key` to at least Redis TIME in microseconds (now_ms * 1000)
-- after a rollback: a fence handed out before it came from a counter that never outran
-- Redis time in us (fewer than 1000 fences per ms on average since the counter was last
-- lifted, and a new node's clock not behind the old one's), so every later fence is
-- greater than every fence handed out before, also those the rollback lost.
local function lift_fence(key, now)
  local floor = now * 1000
  local fence = tonumber(redis.call('GET', key) or '0') or 0
  if fence < floor then
    redis.call('SET', key, string.format('%.0f', floor))
  end
end
