-- plan_ranges: materialise explicit ranges of one shard as pending partitions, ready now.
-- Idempotent: a partition already active or already completed is left alone.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] completed-index bitmap
--      KEYS[4] status counters hash
-- ARGV[1] now ms, then per partition: pid, min id, max id, bit offset in the index
-- Reply: the number materialised.
local now, n = ARGV[1], 0
start_counting(KEYS[4], function() return redis.call('HLEN', KEYS[1]) == 0 end)
for i = 2, #ARGV, 4 do
  local pid, min, max, bit = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if redis.call('GETBIT', KEYS[3], bit) == 0 and redis.call('HEXISTS', KEYS[1], pid) == 0 then
    redis.call('HSET', KEYS[1], pid, encode({'p', '0', '', '', now, '', now, '', min, max, '', ''}))
    redis.call('ZADD', KEYS[2], now, pid)
    n = n + 1
  end
end
moved(nil, 'p', n)
count(KEYS[4])
return n
