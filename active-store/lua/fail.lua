-- fail: record a failed attempt; retry with exponential backoff or give up.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash   KEYS[5] splits hash   KEYS[6] pieces hash
--      KEYS[7] piece_pending zset   KEYS[8] piece_leases zset
-- ARGV[1] pid   ARGV[2] token   ARGV[3] now ms   ARGV[4] error text   ARGV[5] max attempts
--      ARGV[6] backoff base ms   ARGV[7] backoff cap ms
--      ARGV[8] the policy: empty (the backoff), `permanent` (failed now, whatever
--      attempts are left) or a retry delay in ms (instead of the backoff)
-- Reply: {LOST} | {OK, ready ms} (retry scheduled) | {OK, -1} (failed for good)
-- A split partition (split.lua) whose owner part fails for good is whole again, as when
-- a piece's last attempt fails it (piece_fail.lua): its planned range back, from its
-- lowest unfinished ID; its split entry and every piece gone, a running piece fenced.
-- Every argument, the record and, when it fails for good, its split entry and pieces
-- are checked before the first write.
if #ARGV ~= 8 then refuse('argument count', #ARGV) end
local pid, token, now = id(ARGV[1], 'pid'), id(ARGV[2], 'token'), ARGV[3]
num(now, 'now')
local max_attempts = pos(ARGV[5], 'max attempts')
local base, cap = num(ARGV[6], 'backoff base'), num(ARGV[7], 'backoff cap')
local permanent, delay = false, nil
if ARGV[8] == 'permanent' then
  permanent = true
elseif ARGV[8] ~= '' then
  delay = num(ARGV[8], 'retry delay')
end
local s = redis.call('HGET', KEYS[1], pid)
local r = s and checked(KEYS[1], pid, s)
if not leased(r, token) then return {LOST} end
read_counts(KEYS[4])
local attempts = tonumber(r[2])
r[4] = ''
r[7] = now
r[12] = ARGV[4]
-- A key of the wrong type is refused before the first write: the active hash, the
-- counters, the splits and the pieces are read, the lease index is written first (its
-- own refusal writes nothing), and the keys nothing reads are checked before it: the
-- pending set of a retry, the pieces' sets of a split partition failing.
if attempts >= max_attempts or permanent then
  local raw, gone = redis.call('HGET', KEYS[5], pid), nil
  if raw then
    local e = split_decode(KEYS[5], pid, raw)
    gone, r[11] = unsplit_plan(KEYS[6], redis.call('HGETALL', KEYS[6]), pid, e,
      r[11] ~= '' and r[11] or e[9])
    r[9], r[10] = e[9], e[10]
    expect_type(KEYS[7], 'zset')
    expect_type(KEYS[8], 'zset')
  end
  -- Kept in the active hash, out of every index, for `retry_failed` or `discard`.
  moved(r[1], 'f')
  r[1] = 'f'
  redis.call('ZREM', KEYS[2], pid)
  redis.call('HSET', KEYS[1], pid, encode(r))
  if gone then
    variadic('HDEL', KEYS[6], gone)
    variadic('ZREM', KEYS[7], gone)
    variadic('ZREM', KEYS[8], gone)
    redis.call('HDEL', KEYS[5], pid)
  end
  count(KEYS[4])
  return {OK, -1}
end
local backoff = delay or math.min(base * 2 ^ (attempts - 1), cap)
local ready = int(tonumber(now) + backoff)
moved(r[1], 'p')
r[1] = 'p'
expect_type(KEYS[3], 'zset')
redis.call('ZREM', KEYS[2], pid)
redis.call('HSET', KEYS[1], pid, encode(r))
redis.call('ZADD', KEYS[3], ready, pid)
count(KEYS[4])
return {OK, tonumber(ready)}
