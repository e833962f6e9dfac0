#!lua flags=no-writes
-- The size (HLEN) and "version" of many counts hashes in one command, all at one moment:
-- RedisStore.versions and the first half of RedisStore.settled_read (whose packed copies then
-- come by one MGET: a copy is tagged with the version it holds, so it need not be read at the
-- same moment; returned through Lua, 720 copies of 8 kB took Redis three times as long).
--
-- KEYS[1..h]  the counts hashes (all in one slot: one shard of one metric).
-- Returns size, version for each hash in turn; version is nil when the hash is empty (there is
-- none) or has no version. Reads only.
local out = {}
for i = 1, #KEYS do
  local size = redis.call('HLEN', KEYS[i])
  out[2 * i - 1] = size
  out[2 * i] = false
  if size > 0 then
    out[2 * i] = redis.call('HGET', KEYS[i], 'version')
  end
end
return out
