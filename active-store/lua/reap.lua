-- reap: return expired leases of one shard to pending, checkpoint kept. Only the lease
-- index up to now is read (seed 001's time buckets, as a sorted set), so the cost is the
-- number of expired leases, not the size of the active set. Idempotent: any number of
-- reapers may run.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] now ms   ARGV[2] at most this many   ARGV[3] worker (empty: any; otherwise
--      release that worker's leases whatever their deadline)
-- Reply: the pids returned to pending.
local now, limit, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local pids
if worker == '' then
  pids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
else
  pids = redis.call('ZRANGE', KEYS[2], 0, -1)
end
local out = {}
for _, pid in ipairs(pids) do
  local r = decode(redis.call('HGET', KEYS[1], pid) or '')
  if r == nil then
    redis.call('ZREM', KEYS[2], pid)
  elseif worker == '' or r[8] == worker then
    moved(r[1], 'p')
    r[1] = 'p'
    r[4] = ''
    r[7] = now
    redis.call('HSET', KEYS[1], pid, encode(r))
    redis.call('ZREM', KEYS[2], pid)
    redis.call('ZADD', KEYS[3], now, pid)
    out[#out + 1] = pid
  end
end
count(KEYS[4])
return out
