#!lua flags=allow-cross-slot-keys
-- Add groups of batches, each group's summed counts to every target hash of its own, once per
-- batch id, atomically: one call carries the groups of every batch bound for one Redis (on a
-- cluster: for one master), and each group is all or nothing on its own: either every id of
-- the group is new, and then all of them are remembered and the counts added, or nothing of
-- the group is added at all.
--
-- KEYS[1]     the first group's first dedupe key, which a cluster routes the call by. A group's
--             keys share one slot (its metric's shard's), but the groups' slots differ, and a
--             cluster refuses a call that declares keys of several slots: the script reads the
--             keys from ARGV, which the flag lets it do for any slot its node holds.
-- ARGV, group after group:
--   g, t      the number of batch ids and of target hashes;
--   ttl       seconds to remember a batch id;
--   version   the targets' new version: a random number the caller drew for this group and
--             call, so a version is never seen twice, even after Redis lost writes and counts
--             grew back;
--   period    the reporting period the batches' reports were made in (-1: not said), added to
--             each target's "periods" field (",p1,p2,": the periods with data) unless there;
--   g keys    the batch ids' dedupe keys;
--   t keys    the target hashes;
--   t expiries  for each target hash, in order: the Unix time after which it may go, or "" to
--             keep it;
--   m         the number of field, increment arguments that follow;
--   m args    field, increment pairs: the sum of the g batches' counts, the same for every
--             target.
-- Returns one answer per group, in order:
--   {0, v1, v2, ...} when the group was applied now: every target's "batches" grew by g, its
--             "version" became the group's, its "periods" holds the group's period, and vt is
--             target t's version before (0: none; -1 when the hash is gone: an expiry already
--             past). Versions stay strings: Lua numbers are doubles.
--   {i, ...}  the (1-based, so >= 1) positions of the group's ids that had already been
--             applied (by an earlier call, or an earlier group of this one): nothing of the
--             group was added, and the caller leaves those out and sends the rest again.
--   {-2, message}  a command of the group failed, and nothing of it was written unless the
--             failure was data that is not ours (below); the other groups are answered as
--             usual. On a cluster, a group whose slot this node does not serve (moved, or
--             moving and the key not here) fails at its first EXISTS, so before any write.
--
-- With flags, Redis refuses the whole call before it runs when it takes no writes (memory full
-- under noeviction, a failed RDB save or AOF write, a read-only replica, too few replicas), so
-- such a refusal never leaves a call half applied. Every id of a group is checked before
-- anything of it is written, and its dedupe SETs are its first writes. Redis does not roll a
-- script back when a command fails halfway: past a group's first SET only data that is not
-- ours (a key of another type, a field that is not an integer) or an int64 overflow could fail
-- one.
local answers = {}
local arg = 0

local function add_group(g, t, m)
  local ids, targets = arg + 5, arg + 5 + g  -- ARGV[ids + i]: id i's key; ARGV[targets + j]: target j
  local seen = {}
  for i = 1, g do
    if redis.call('EXISTS', ARGV[ids + i]) == 1 then
      seen[#seen + 1] = i
    end
  end
  if #seen > 0 then
    -- Rewrite each such id's expiry unchanged: this is a write, so a WAIT after a duplicate
    -- also waits until the replicas have reached the attempt that applied the batch.
    for _, i in ipairs(seen) do
      redis.call('PEXPIREAT', ARGV[ids + i], redis.call('PEXPIRETIME', ARGV[ids + i]))
    end
    return seen
  end
  local ttl, version = ARGV[arg + 3], ARGV[arg + 4]
  for i = 1, g do
    redis.call('SET', ARGV[ids + i], '1', 'EX', ttl)
  end
  local period = ',' .. ARGV[arg + 5] .. ','
  local expiries = targets + t  -- ARGV[expiries + j]: target j's
  local first, last = expiries + t + 2, expiries + t + 1 + m
  local before = {0}
  for j = 1, t do
    local target, expires_at = ARGV[targets + j], ARGV[expiries + j]
    local fresh = redis.call('EXISTS', target) == 0
    local was = redis.call('HGET', target, 'version') or 0
    -- A hash kept from before periods were recorded may hold reports of any period: -1.
    local periods = redis.call('HGET', target, 'periods') or (fresh and ',' or ',-1,')
    if not string.find(periods, period, 1, true) then
      redis.call('HSET', target, 'periods', periods .. ARGV[arg + 5] .. ',')
    end
    for a = first, last, 2 do
      redis.call('HINCRBY', target, ARGV[a], ARGV[a + 1])
    end
    redis.call('HINCRBY', target, 'batches', g)
    redis.call('HSET', target, 'version', version)
    if expires_at ~= '' then
      -- A new hash takes the expiry; an existing one only ever keeps the later one (GT), and a
      -- hash without expiry (a total window) keeps none.
      if fresh then
        redis.call('EXPIREAT', target, expires_at)
      else
        redis.call('EXPIREAT', target, expires_at, 'GT')
      end
      if redis.call('EXISTS', target) == 0 then
        was = -1
      end
    end
    before[j + 1] = was
  end
  return before
end

while arg < #ARGV do
  local g, t = tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
  local m = tonumber(ARGV[arg + 6 + g + 2 * t])
  local ok, answer = pcall(add_group, g, t, m)
  if not ok then
    answer = {-2, type(answer) == 'table' and answer.err or tostring(answer)}
  end
  answers[#answers + 1] = answer
  arg = arg + 6 + g + 2 * t + m
end
return answers
