-- plan_ranges: materialise explicit ranges of one shard as pending partitions, ready now.
-- Idempotent: a partition already active or already completed is left alone.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] completed-index bitmap
--      KEYS[4] status counters hash
-- ARGV[1] now ms, then per partition: pid, min id, max id, bit offset in the index
-- Reply: the number materialised.
-- Every argument is checked, and every partition's state read, before the first write.
entries(1, 4, true)
local now = ARGV[1]
num(now, 'now')
for i = 2, #ARGV, 4 do
  id(ARGV[i], 'pid')
  local min, max = id(ARGV[i + 1], 'min id'), id(ARGV[i + 2], 'max id')
  if id_lt(max, min) then refuse('range', min .. '..=' .. max) end
  id(ARGV[i + 3], 'bit offset')
end
local new, n, seen = {}, 0, {}
for i = 2, #ARGV, 4 do
  local pid, bit = ARGV[i], ARGV[i + 3]
  if not seen[pid] and redis.call('GETBIT', KEYS[3], bit) == 0 and redis.call('HEXISTS', KEYS[1], pid) == 0 then
    n = n + 1
    new[n] = i
    seen[pid] = true
  end
end
read_counts(KEYS[4])
-- A key of the wrong type is refused before the first write: the index, the active hash
-- and the counters were read above (the active hash once there is anything to write),
-- and the pending set, which nothing reads, is written first (its own refusal writes
-- nothing).
for _, i in ipairs(new) do redis.call('ZADD', KEYS[2], now, ARGV[i]) end
start_counting(KEYS[4], function() return redis.call('HLEN', KEYS[1]) == 0 end)
for _, i in ipairs(new) do
  local pid, min, max = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('HSET', KEYS[1], pid, encode({'p', '0', '', '', now, '', now, '', min, max, '', ''}))
end
moved(nil, 'p', n)
count(KEYS[4])
return n
