-- discard: drop a failed or pending partition from the active set for good (an
-- operator's decision). Claimed and running partitions are refused: release or reap
-- them first, so no live lease is pulled from under a worker.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
-- ARGV[1] pid
-- Reply: 1 dropped, 0 not active, -2 leased.
local pid = ARGV[1]
local r = decode(redis.call('HGET', KEYS[1], pid) or '')
if r == nil then return 0 end
if r[1] == 'c' or r[1] == 'r' then return -2 end
redis.call('HDEL', KEYS[1], pid)
redis.call('ZREM', KEYS[2], pid)
moved(r[1], nil)
count(KEYS[3])
return 1
