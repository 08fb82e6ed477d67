-- fail: record a failed attempt; retry with exponential backoff or give up.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] pid   ARGV[2] token   ARGV[3] now ms   ARGV[4] error text   ARGV[5] max attempts
--      ARGV[6] backoff base ms   ARGV[7] backoff cap ms
--      ARGV[8] (optional) `permanent` (failed now, whatever attempts are left) or a
--      retry delay in ms (instead of the backoff)
-- Reply: {LOST} | {OK, ready ms} (retry scheduled) | {OK, -1} (failed for good)
local pid, token, now = ARGV[1], ARGV[2], ARGV[3]
local permanent, delay = ARGV[8] == 'permanent', tonumber(ARGV[8])
if ARGV[8] and not permanent and not (delay and delay >= 0 and delay == math.floor(delay)) then
  return redis.error_reply('ERR fail: ARGV[8] must be `permanent` or a delay in ms')
end
local r = decode(redis.call('HGET', KEYS[1], pid) or '')
if not leased(r, token) then return {LOST} end
local attempts = tonumber(r[2])
r[4] = ''
r[7] = now
r[12] = ARGV[4]
redis.call('ZREM', KEYS[2], pid)
if attempts >= tonumber(ARGV[5]) or permanent then
  -- Kept in the active hash, out of every index, for `retry_failed` or `discard`.
  moved(r[1], 'f')
  r[1] = 'f'
  redis.call('HSET', KEYS[1], pid, encode(r))
  count(KEYS[4])
  return {OK, -1}
end
local backoff = delay or math.min(tonumber(ARGV[6]) * 2 ^ (attempts - 1), tonumber(ARGV[7]))
local ready = int(tonumber(now) + backoff)
moved(r[1], 'p')
r[1] = 'p'
redis.call('HSET', KEYS[1], pid, encode(r))
redis.call('ZADD', KEYS[3], ready, pid)
count(KEYS[4])
return {OK, tonumber(ready)}
