-- discard: give up a failed or pending partition for good (an operator's decision).
-- Its record stays, marked discarded (status d), so the pid answers "discarded" for
-- ever: never claimed again, never archived, never mistaken for completed. Claimed and
-- running partitions are refused: release or reap them first, so no live lease is
-- pulled from under a worker. A pid of a uniform plan that the shard's cursor has not
-- issued yet is pending too: its record is created discarded, and the plan's entry in
-- the shard's plans list is split around it (the piece before keeps the cursor, the
-- piece after starts at the pid after), so the cursor never issues it.
-- A split partition (split.lua), its owner part pending or failed, is discarded whole:
-- its planned range back, from its lowest unfinished ID; its split entry and every piece
-- gone, pending or not (a running piece is fenced: its holder's beat, completion and
-- failure are refused as lost), so nothing of it is claimed or completed again.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
--      KEYS[4] the shard's plans list   KEYS[5] cursor hash   KEYS[6] splits hash
--      KEYS[7] pieces hash   KEYS[8] piece_pending zset   KEYS[9] piece_leases zset
-- ARGV[1] pid   ARGV[2] now ms
-- Reply: 1 discarded, 0 not pending or failed, -2 leased.
-- Every argument, the record, its split entry and pieces, the plan entries and cursors
-- are checked before the first write.
if #ARGV ~= 2 then refuse('argument count', #ARGV) end
local pid, now = id(ARGV[1], 'pid'), ARGV[2]
num(now, 'now')
read_counts(KEYS[3])
local s = redis.call('HGET', KEYS[1], pid)
if s then
  local r = checked(KEYS[1], pid, s)
  if r[1] == 'd' then return 0 end
  if r[1] == 'c' or r[1] == 'r' then return -2 end
  local raw, gone = redis.call('HGET', KEYS[6], pid), nil
  if raw then
    local e = split_decode(KEYS[6], pid, raw)
    local from
    if e[7] == '0' then from = r[11] ~= '' and r[11] or e[9] end
    gone, r[11] = unsplit_plan(KEYS[7], redis.call('HGETALL', KEYS[7]), pid, e, from)
    r[9], r[10] = e[9], e[10]
  end
  moved(r[1], 'd')
  r[1] = 'd'
  r[4] = ''
  r[7] = now
  -- A key of the wrong type is refused before the first write: the counters, the active
  -- hash, the splits and the pieces were read above, the pending set is written first
  -- (its own refusal writes nothing), and the pieces' sets, which nothing reads, are
  -- checked.
  if gone then
    expect_type(KEYS[8], 'zset')
    expect_type(KEYS[9], 'zset')
  end
  redis.call('ZREM', KEYS[2], pid)
  redis.call('HSET', KEYS[1], pid, encode(r))
  if gone then
    variadic('HDEL', KEYS[7], gone)
    variadic('ZREM', KEYS[8], gone)
    variadic('ZREM', KEYS[9], gone)
    redis.call('HDEL', KEYS[6], pid)
  end
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
