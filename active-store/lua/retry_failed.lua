-- retry_failed: put failed partitions of one shard back to pending with a fresh attempt
-- budget (an operator's decision after fixing the cause).
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
-- ARGV[1] now ms, ARGV[2] pid (empty: every failed partition of the shard)
-- Reply: the pids requeued.
local now, only = ARGV[1], ARGV[2]
local out = {}
local function requeue(pid, r)
  if r and r[1] == 'f' then
    moved('f', 'p')
    r[1] = 'p'
    r[2] = '0'
    r[7] = now
    redis.call('HSET', KEYS[1], pid, encode(r))
    redis.call('ZADD', KEYS[2], now, pid)
    out[#out + 1] = pid
  end
end
if only ~= '' then
  requeue(only, decode(redis.call('HGET', KEYS[1], only) or ''))
else
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do requeue(all[i], decode(all[i + 1])) end
end
count(KEYS[3])
return out
