-- retry_failed: put failed partitions of one shard back to pending with a fresh attempt
-- budget (an operator's decision after fixing the cause).
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
-- ARGV[1] now ms, ARGV[2] pid (empty: every failed partition of the shard)
-- Reply: the pids requeued.
-- Every argument and every record read is checked before the first write.
if #ARGV ~= 2 then refuse('argument count', #ARGV) end
local now, only = ARGV[1], opt_id(ARGV[2], 'pid')
num(now, 'now')
local found, nf = {}, 0
local function consider(pid, s)
  local r = checked(KEYS[1], pid, s)
  if r[1] == 'f' then
    nf = nf + 1
    found[nf] = {pid, r}
  end
end
if only ~= '' then
  local s = redis.call('HGET', KEYS[1], only)
  if s then consider(only, s) end
else
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do consider(all[i], all[i + 1]) end
end
read_counts(KEYS[3])
-- The pending set, which nothing reads, is written first: a key of the wrong type there
-- is refused by that write alone (the active hash and the counters were read above).
local out = {}
for i = 1, nf do
  out[i] = found[i][1]
  redis.call('ZADD', KEYS[2], now, out[i])
end
for i = 1, nf do
  local pid, r = found[i][1], found[i][2]
  moved('f', 'p')
  r[1] = 'p'
  r[2] = '0'
  r[7] = now
  redis.call('HSET', KEYS[1], pid, encode(r))
end
count(KEYS[3])
return out
