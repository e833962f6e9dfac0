-- Add a group of batches' summed counts to every target hash, once per batch id, atomically:
-- either every id of the group is new, and then all of them are remembered and the counts
-- added, or nothing is added at all.
--
-- KEYS[1..g]  the batch ids' dedupe keys (g = ARGV[1]); KEYS[g+1..] the target hashes (all in
--             the metric's slot).
-- ARGV[1]     g, the number of batch ids.
-- ARGV[2]     seconds to remember a batch id.
-- ARGV[3]     the targets' new version: a random number the caller drew for this call, so a
--             version is never seen twice, even after Redis lost writes and counts grew back.
-- ARGV[4]     the reporting period the batches' reports were made in (-1: not said), added to
--             each target's "periods" field (",p1,p2,": the periods with data) unless there.
-- ARGV[5..]   for each target hash, in order: the Unix time after which it may go, or "" to
--             keep it.
-- then        field, increment pairs: the sum of the g batches' counts, the same for every
--             target.
-- Returns {0, v1, v2, ...} when the group was applied now: every target's "batches" grew by g,
-- its "version" became ARGV[3], its "periods" holds ARGV[4], and vt is target t's version before (0: none; -1 when the hash
-- is gone: an expiry already past). Versions stay strings: Lua numbers are doubles.
-- Otherwise the (1-based, so >= 1) positions of the ids that had already been applied, and
-- nothing was added: the caller leaves those out and sends the rest again, summed again.
--
-- Every id is checked before anything is written, and the dedupe SETs are the first writes:
-- if Redis refuses the first one (OOM, read-only replica) nothing else happens, and once it
-- succeeds the rest follow in the same atomic step. Redis does not roll a script back when a
-- command fails halfway; past the first SET only data that is not ours (a key of another type,
-- a field that is not an integer) or an int64 overflow could fail one.
local g = tonumber(ARGV[1])
local seen = {}
for i = 1, g do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    seen[#seen + 1] = i
  end
end
if #seen > 0 then
  -- Rewrite each such id's expiry unchanged: this is a write, so a WAIT after a duplicate also
  -- waits until the replicas have reached the attempt that applied the batch.
  for _, i in ipairs(seen) do
    redis.call('PEXPIREAT', KEYS[i], redis.call('PEXPIRETIME', KEYS[i]))
  end
  return seen
end
for i = 1, g do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[2])
end
local targets = #KEYS - g
local first = 5 + targets
local period = ',' .. ARGV[4] .. ','

local before = {0}
for t = 1, targets do
  local key, expires_at = KEYS[g + t], ARGV[4 + t]
  local fresh = redis.call('EXISTS', key) == 0
  local was = redis.call('HGET', key, 'version') or 0
  -- A hash kept from before periods were recorded may hold reports of any period: -1.
  local periods = redis.call('HGET', key, 'periods') or (fresh and ',' or ',-1,')
  if not string.find(periods, period, 1, true) then
    redis.call('HSET', key, 'periods', periods .. ARGV[4] .. ',')
  end
  for a = first, #ARGV, 2 do
    redis.call('HINCRBY', key, ARGV[a], ARGV[a + 1])
  end
  redis.call('HINCRBY', key, 'batches', g)
  redis.call('HSET', key, 'version', ARGV[3])
  if expires_at ~= '' then
    -- A new hash takes the expiry; an existing one only ever keeps the later one (GT), and a
    -- hash without expiry (a total window) keeps none.
    if fresh then
      redis.call('EXPIREAT', key, expires_at)
    else
      redis.call('EXPIREAT', key, expires_at, 'GT')
    end
    if redis.call('EXISTS', key) == 0 then
      was = -1
    end
  end
  before[t + 1] = was
end
return before
