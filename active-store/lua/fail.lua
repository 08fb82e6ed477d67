-- fail: record a failed attempt; retry with exponential backoff or give up.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] pid   ARGV[2] token   ARGV[3] now ms   ARGV[4] error text   ARGV[5] max attempts
--      ARGV[6] backoff base ms   ARGV[7] backoff cap ms
--      ARGV[8] the policy: empty (the backoff), `permanent` (failed now, whatever
--      attempts are left) or a retry delay in ms (instead of the backoff)
-- Reply: {LOST} | {OK, ready ms} (retry scheduled) | {OK, -1} (failed for good)
-- Every argument and the record are checked before the first write.
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
if attempts >= max_attempts or permanent then
  -- Kept in the active hash, out of every index, for `retry_failed` or `discard`.
  moved(r[1], 'f')
  r[1] = 'f'
  redis.call('ZREM', KEYS[2], pid)
  redis.call('HSET', KEYS[1], pid, encode(r))
  count(KEYS[4])
  return {OK, -1}
end
local backoff = delay or math.min(base * 2 ^ (attempts - 1), cap)
local ready = int(tonumber(now) + backoff)
moved(r[1], 'p')
r[1] = 'p'
redis.call('ZREM', KEYS[2], pid)
redis.call('HSET', KEYS[1], pid, encode(r))
redis.call('ZADD', KEYS[3], ready, pid)
count(KEYS[4])
return {OK, tonumber(ready)}
