-- Node stamps: how a script sees that Redis rolled back (docs/rollback-design.md).
-- Prepended to every script that hands out something a rollback could hand out twice
-- (claim, guard open, the mint marks, pool acquire, lock acquire).
--
-- A node stamp names the server process and its replication history: 15 decimal digits
-- of SHA1(run_id .. ':' .. master_replid) (INFO server, INFO replication). run_id is new
-- at every start of redis-server (so a restart from an older RDB or AOF changes it), and
-- master_replid is new at every promotion of a replica (so a failover, also back to a
-- node that was primary before, changes it). A value written with the stamp of the node
-- that runs this script now was written on this node in this life: no rollback can have
-- taken its later writes away without changing the stamp. Any other stamp, or none, means
-- the value may be older than what was handed out: the caller treats it as after a loss.
--
-- Stamped values read as numbers by older versions: "<integer>.<stamp>" (the stamp in
-- the place of a fraction), so tonumber() of an old sidecar still gets the integer part.
-- Errors: a server whose INFO shows no run_id or master_replid (nothing could be seen).

local node_stamp_memo = nil

-- The stamp of the node that runs this script; INFO is read once per script (two INFO
-- sections cost about 15 us of Redis time, so callers ask only on the paths that hand out).
local function node_stamp()
  if node_stamp_memo then return node_stamp_memo end
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  if not run_id or not replid then
    error({err = 'ERR node: INFO shows no run_id or master_replid, so a rollback could not be seen'})
  end
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
