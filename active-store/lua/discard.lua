-- discard: give up a failed or pending partition for good (an operator's decision).
-- Its record stays, marked discarded (status d), so the pid answers "discarded" for
-- ever: never claimed again, never archived, never mistaken for completed. Claimed and
-- running partitions are refused: release or reap them first, so no live lease is
-- pulled from under a worker. A pid of a uniform plan that the shard's cursor has not
-- issued yet is pending too: its record is created discarded, and the plan's entry in
-- the shard's plans list is split around it (the piece before keeps the cursor, the
-- piece after starts at the pid after), so the cursor never issues it.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
--      KEYS[4] the shard's plans list   KEYS[5] cursor hash
-- ARGV[1] pid   ARGV[2] now ms
-- Reply: 1 discarded, 0 not pending or failed, -2 leased.
-- Every argument, the record, the plan entries and cursors are checked before the first
-- write.
if #ARGV ~= 2 then refuse('argument count', #ARGV) end
local pid, now = id(ARGV[1], 'pid'), ARGV[2]
num(now, 'now')
read_counts(KEYS[3])
local s = redis.call('HGET', KEYS[1], pid)
if s then
  local r = checked(KEYS[1], pid, s)
  if r[1] == 'd' then return 0 end
  if r[1] == 'c' or r[1] == 'r' then return -2 end
  moved(r[1], 'd')
  r[1] = 'd'
  r[4] = ''
  r[7] = now
  redis.call('HSET', KEYS[1], pid, encode(r))
  redis.call('ZREM', KEYS[2], pid)
  count(KEYS[3])
  return 1
end
-- Not materialised: discardable if a cursor has yet to issue it (the caller sends the
-- pid to its own shard, whose cursor passes only this shard's pids).
if not is_num(pid) then return 0 end
local p = tonumber(pid)
for i, plan in ipairs(read_cursors(KEYS[5], read_plans(KEYS[4]))) do
  local first, last, at, entry = plan[1], plan[2], plan[3], plan[4]
  if first <= p and p <= last and at <= p then
    local left
    if p > first then
      left = int(first) .. '|' .. int(p - 1)
    else
      -- The piece of the pid itself, already passed by its cursor.
      left = int(first) .. '|' .. int(first)
      redis.call('HSET', KEYS[5], int(first), int(first + 1))
    end
    redis.call('LSET', KEYS[4], i - 1, left)
    if p < last then
      redis.call('LINSERT', KEYS[4], 'AFTER', left, int(p + 1) .. '|' .. int(last))
      redis.call('HSET', KEYS[5], int(p + 1), int(p + 1))
    end
    -- min and max empty: derived from the uniform plan, as for a fresh lease.
    redis.call('HSET', KEYS[1], pid, encode({'d', '0', '', '', now, '', now, '', '', '', '', ''}))
    moved(nil, 'd')
    count(KEYS[3])
    return 1
  end
end
return 0
