-- Read one high-water mark of the old app for `mint carry-over`, as this node can vouch
-- for it (vouch.lua's rule, without writing): a mark another node or life wrote may be below
-- reservations a rollback lost.
--
-- KEYS[1]  the mark <prefix><old app>:mark:{<lease key>}
--
-- Returns {mark, here, time_ms}: the mark's Unix ms (0 when missing), 1 when this node wrote
-- it in its current life (else 0: another node's stamp, none, or missing), Redis TIME in ms
local mark, stamp = unstamp(redis.call('GET', KEYS[1]))
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return {mark or 0, stamped_here(stamp) and 1 or 0, now}
