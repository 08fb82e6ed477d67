-- carry: give adopted partitions of one shard the attempts (and the failed status) they
-- had in the system they were adopted from (`tranche import --from-hash`). Only a
-- pending record is changed, so a partition claimed since is left to its worker, and a
-- second call with the same arguments changes nothing more.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
-- ARGV[1] now ms, then per partition: pid, attempts, status (p or f), worker id
-- Reply: the number of records changed.
-- Every argument, and every record read, is checked before the first write: Redis keeps
-- what a failing script wrote, so a bad entry late in the list must not leave the
-- earlier ones carried.
local now, n = ARGV[1], 0
if not is_num(now) or (#ARGV - 1) % 4 ~= 0 then
  return redis.error_reply('ERR carry: malformed arguments')
end
for i = 2, #ARGV, 4 do
  if not is_id(ARGV[i]) or not is_num(ARGV[i + 1])
      or (ARGV[i + 2] ~= 'p' and ARGV[i + 2] ~= 'f') or string.find(ARGV[i + 3], '|', 1, true) then
    return redis.error_reply('ERR carry: malformed entry for pid ' .. ARGV[i])
  end
end
local seen, changed, failed, nc, nf = {}, {}, {}, 0, 0
for i = 2, #ARGV, 4 do
  local pid, attempts, status, worker = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local r = seen[pid]
  if r == nil then
    local s = redis.call('HGET', KEYS[1], pid)
    r = s and checked(KEYS[1], pid, s) or false
    seen[pid] = r
  end
  if r and r[1] == 'p' and (r[2] ~= attempts or status ~= 'p') then
    r[2] = attempts
    r[7] = now
    if status == 'f' then
      -- Out of every index, as fail.lua leaves a partition out of attempts.
      moved('p', 'f')
      r[1] = 'f'
      r[8] = worker
      nf = nf + 1
      failed[nf] = pid
    end
    nc = nc + 1
    changed[nc] = pid
    n = n + 1
  end
end
read_counts(KEYS[3])
-- The pending set, which nothing reads, is written first: a key of the wrong type there
-- is refused by that write alone (the active hash and the counters were read above).
for i = 1, nf do redis.call('ZREM', KEYS[2], failed[i]) end
for i = 1, nc do redis.call('HSET', KEYS[1], changed[i], encode(seen[changed[i]])) end
count(KEYS[3])
return n
