-- Add one batch's counts to every target hash, once per batch id, atomically.
--
-- KEYS[1]     the batch id's dedupe key; KEYS[2..] the target hashes (all in the metric's slot).
-- ARGV[1]     seconds to remember the batch id.
-- ARGV[i]     for i = 2..#KEYS: the Unix time after which KEYS[i] may go, or "" to keep it.
-- ARGV[#KEYS+1..]  field, increment pairs, the same for every target.
-- Returns 1 when the batch was applied now, 0 when its id had already been applied.
--
-- The dedupe SET is the first write: if Redis refuses it (OOM, read-only replica) nothing
-- else happens, and once it succeeds the increments follow in the same atomic step. Redis does
-- not roll a script back when a command fails halfway; past the SET only data that is not ours
-- (a key of another type, a field that is not an integer) or an int64 overflow could fail one.
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  -- Rewrite the id's expiry unchanged: this is a write, so a WAIT after a duplicate also waits
  -- until the replicas have reached the attempt that applied the batch.
  redis.call('PEXPIREAT', KEYS[1], redis.call('PEXPIRETIME', KEYS[1]))
  return 0
end
local first = #KEYS + 1
for i = 2, #KEYS do
  local key, expires_at = KEYS[i], ARGV[i]
  local fresh = redis.call('EXISTS', key) == 0
  for a = first, #ARGV, 2 do
    redis.call('HINCRBY', key, ARGV[a], ARGV[a + 1])
  end
  redis.call('HINCRBY', key, 'batches', 1)
  if expires_at ~= '' then
    -- A new hash takes the expiry; an existing one only ever keeps the later one (GT), and a
    -- hash without expiry (a total window) keeps none.
    if fresh then
      redis.call('EXPIREAT', key, expires_at)
    else
      redis.call('EXPIREAT', key, expires_at, 'GT')
    end
  end
end
return 1
