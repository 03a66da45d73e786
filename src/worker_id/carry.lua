-- Raise one worker ID's high-water mark of a new app to the floor a format change needs
-- (docs/kubernetes.md, "Upgrading"; `snowlease mint carry-over`): the new app's sidecars
-- then mint only above it, so none of its IDs equals one the old app minted.
--
-- KEYS[1]  the mark <prefix><app>:mark:{<lease key>} of the new app
-- ARGV[1]  the floor, Unix ms (integer >= 0)
--
-- Returns the mark after the call: max(mark, floor), stamped by this node (node.lua), so the
-- sidecars take it as written here (a mark from before a rollback would be raised anyway)
-- Errors: a mark that is not an integer (written by hand): nothing written
local floor = tonumber(ARGV[1])
if floor == nil or floor < 0 or floor ~= math.floor(floor) then
  return redis.error_reply('ERR carry: floor must be an integer >= 0 (Unix ms)')
end
local raw = redis.call('GET', KEYS[1])
local mark = unstamp(raw)
if raw and mark == nil then
  return redis.error_reply('ERR carry: the mark ' .. KEYS[1] .. ' is not Unix ms (set by hand?); nothing written')
end
mark = math.max(mark or 0, floor)
redis.call('SET', KEYS[1], stamped(mark))
return mark
