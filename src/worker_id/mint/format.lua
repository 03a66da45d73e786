-- Record the ID format an app mints in, or read the one recorded (docs/worker.md, "Mint
-- mode"): the high-water marks are Unix ms, which say nothing of how an ID encodes its
-- timestamp, so a holder minting in another --id-layout or --epoch could mint IDs an earlier
-- holder minted. Every sidecar checks the recorded format before it mints.
--
-- KEYS[1]  <prefix><app>:format: "<layout>@<epoch Unix ms>", e.g. "41:10:12@1288834974657";
--          no expiry, never changed by a sidecar
-- ARGV[1]  the caller's format, same form
--
-- Returns the recorded format: ARGV[1] when this call recorded it (no record before), else
-- the earlier record (equal to ARGV[1] or not; the caller refuses to mint when not)
local recorded = redis.call('GET', KEYS[1])
if not recorded then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return recorded
