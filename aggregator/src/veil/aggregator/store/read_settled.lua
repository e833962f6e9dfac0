#!lua flags=no-writes
-- What RedisStore.settled_read needs of each counts hash, for many hashes in one command, all
-- at one moment: its size (HLEN), its "version", and its packed copy.
--
-- KEYS[1..h]     the counts hashes (all in one slot: one shard of one metric).
-- KEYS[h+1..2h]  their packed copies, in the same order.
-- Returns size, version, copy for each hash in turn; version and copy are nil when the hash is
-- empty (there is none) or they are not set. Reads only.
--
-- With ARGV[1] = "versions" (RedisStore.versions), KEYS are the counts hashes alone and the
-- answer is each one's version (nil where there is none).
if ARGV[1] == 'versions' then
  local versions = {}
  for i = 1, #KEYS do
    versions[i] = redis.call('HGET', KEYS[i], 'version')
  end
  return versions
end
local h = #KEYS / 2
local out = {}
for i = 1, h do
  local size = redis.call('HLEN', KEYS[i])
  out[3 * i - 2] = size
  out[3 * i - 1] = false
  out[3 * i] = false
  if size > 0 then
    out[3 * i - 1] = redis.call('HGET', KEYS[i], 'version')
    out[3 * i] = redis.call('GET', KEYS[h + i])
  end
end
return out
