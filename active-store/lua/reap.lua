-- reap: return expired leases of one shard to pending, checkpoint kept. Only the lease
-- index up to now is read (seed 001's time buckets, as a sorted set), so the cost is the
-- number of expired leases, not the size of the active set. Idempotent: any number of
-- reapers may run.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] now ms   ARGV[2] at most this many   ARGV[3] worker (empty: any; otherwise
--      release that worker's leases whatever their deadline)   ARGV[4] max attempts
-- Reply: the pids returned to pending. A lease that expired on its last attempt
-- (attempts >= max attempts) is failed instead: a partition that crashes its worker
-- every time must not be retried for ever.
local now, limit, worker, max_attempts = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if not limit or not max_attempts then return redis.error_reply('reap: bad arguments') end
local pids
if worker == '' then
  pids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
else
  pids = redis.call('ZRANGE', KEYS[2], 0, -1)
end
local out = {}
for _, pid in ipairs(pids) do
  local r = decode(redis.call('HGET', KEYS[1], pid) or '')
  if pid == SKIPLIST_KEEPER then
    -- Not a lease (see record.lua); only the whole-index read of a worker meets it.
  elseif r == nil then
    redis.call('ZREM', KEYS[2], pid)
  elseif worker == '' or r[8] == worker then
    local attempts = tonumber(r[2]) or 0
    r[4] = ''
    r[7] = now
    redis.call('ZREM', KEYS[2], pid)
    if attempts >= max_attempts then
      moved(r[1], 'f')
      r[1] = 'f'
      r[12] = 'lease expired on attempt ' .. r[2] .. ' of ' .. ARGV[4] .. ' (the worker died or stalled)'
      redis.call('HSET', KEYS[1], pid, encode(r))
    else
      moved(r[1], 'p')
      r[1] = 'p'
      redis.call('HSET', KEYS[1], pid, encode(r))
      redis.call('ZADD', KEYS[3], now, pid)
      out[#out + 1] = pid
    end
  end
end
count(KEYS[4])
return out
