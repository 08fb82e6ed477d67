-- piece_fail: a piece's attempt ended with its work undone (split.lua), and is spent:
-- its holder reports a failed chunk ('fail'), its lease expired ('reap'), or its worker
-- is gone ('worker'). The piece is pending again from its checkpoint (after the backoff
-- for a failure, at once for a lost lease), or, on its last attempt or a permanent
-- failure, its partition fails for good (`unsplit` below).
-- KEYS[1] pieces hash   KEYS[2] piece_pending zset   KEYS[3] piece_leases zset
--      KEYS[4] splits hash   KEYS[5] active hash   KEYS[6] leases zset
--      KEYS[7] pending zset   KEYS[8] status counters hash
-- ARGV[1] now ms   ARGV[2] max attempts   ARGV[3] mode, then
--      'fail': ARGV[4] `pid:start`   ARGV[5] token   ARGV[6] progress (empty: keep)
--              ARGV[7] error text   ARGV[8] backoff base ms   ARGV[9] backoff cap ms
--              ARGV[10] policy: empty (the backoff), `permanent` (its partition fails
--              now, whatever attempts are left) or a retry delay in ms
--      'reap': nothing more (every piece whose deadline is at or before now, 1000 at
--              most)
--      'worker': ARGV[4] worker (every piece it holds, whatever its deadline)
-- Reply: 'fail': {LOST} | {OK, ready ms} (retry scheduled) | {OK, -1} (its partition
--      failed); 'reap' and 'worker': the pieces returned to pending.
-- Every argument and everything read (the pieces, and for a partition that fails its
-- record, split entry, other pieces and the counters) is checked before the first write.
if #ARGV < 3 then refuse('argument count', #ARGV) end
local now, max_attempts, mode = ARGV[1], pos(ARGV[2], 'max attempts'), ARGV[3]
num(now, 'now')
local keys, given
if mode == 'fail' then
  if #ARGV ~= 10 then refuse('argument count', #ARGV) end
  piece_key(ARGV[4], 'piece')
  given = {token = id(ARGV[5], 'token'), progress = opt_id(ARGV[6], 'progress'),
    error = ARGV[7], base = num(ARGV[8], 'backoff base'), cap = num(ARGV[9], 'backoff cap')}
  if ARGV[10] == 'permanent' then
    given.permanent = true
  elseif ARGV[10] ~= '' then
    given.delay = num(ARGV[10], 'retry delay')
  end
  keys = {ARGV[4]}
elseif mode == 'reap' then
  if #ARGV ~= 3 then refuse('argument count', #ARGV) end
  keys = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
elseif mode == 'worker' then
  if #ARGV ~= 4 then refuse('argument count', #ARGV) end
  worker_id(ARGV[4], 'worker')
  keys = redis.call('ZRANGE', KEYS[3], 0, -1)
else
  refuse('mode', mode)
end
if #keys == 0 then return {} end

-- Each piece met: back to pending, or its partition to fail (with the first reason).
local recs = redis.call('HMGET', KEYS[1], unpack(keys))
local back, nb, stale, failing, nf, reason, latest = {}, 0, {}, {}, 0, {}, {}
for i, key in ipairs(keys) do
  local r = recs[i] and checked(KEYS[1], key, recs[i])
  local pid = string.match(key, '^(%d+):%d+$')
  if given then
    if not leased(r, given.token) then return {LOST} end
    r[11] = later(r[11], given.progress)
    r[12] = given.error
  end
  if not r then
    -- A lease entry without its piece (its partition completed or failed): dropped.
    stale[#stale + 1] = key
  elseif not pid or not is_id(pid) then
    corrupt(KEYS[3], key, 'not a piece field')
  elseif given or ((r[1] == 'c' or r[1] == 'r') and (mode == 'reap' or r[8] == ARGV[4])) then
    latest[key] = r[11]
    local attempts = tonumber(r[2])
    if attempts >= max_attempts or (given and given.permanent) then
      if not reason[pid] then
        nf = nf + 1
        failing[nf] = pid
        reason[pid] = given and given.error
          or ('the lease of its piece from ' .. string.match(key, ':(%d+)$') .. ' expired on attempt '
            .. r[2] .. ' of ' .. ARGV[2] .. ' (the worker died or stalled)')
      end
    else
      local ready = now
      if given then
        ready = int(tonumber(now) + (given.delay or math.min(given.base * 2 ^ (attempts - 1), given.cap)))
      end
      r[1], r[4], r[7] = 'p', '', now
      nb = nb + 1
      back[nb] = {key, r, ready, pid}
    end
  end
end

-- `unsplit`: a partition P failing for good is whole again. Its record takes back its
-- planned range, with the lowest ID any unfinished part had not done as its
-- checkpoint (its owner part's, unless that part is done, and every piece's), status
-- failed and the reason; its split entry and every piece go, so every lease on a part
-- of it is lost (its owner's too: the record is no longer leased). `retry_failed` puts
-- it back to pending as any failed partition, to be redone from that checkpoint. A
-- discarded P stays discarded. Planned here, from what is read and checked; written
-- below.
local plans, all = {}, nil
for j = 1, nf do
  local pid = failing[j]
  local raw = redis.call('HGET', KEYS[4], pid)
  if not raw then corrupt(KEYS[4], pid, 'a piece without its split entry') end
  local e = split_decode(KEYS[4], pid, raw)
  local s = redis.call('HGET', KEYS[5], pid)
  local p = s and checked(KEYS[5], pid, s)
  local from
  if p and e[7] == '0' then from = p[11] ~= '' and p[11] or e[9] end
  all = all or redis.call('HGETALL', KEYS[1])
  local gone
  gone, from = unsplit_plan(KEYS[1], all, pid, e, from, latest)
  plans[j] = {pid, e, p, gone, from}
end
if nf > 0 then read_counts(KEYS[8]) end

-- A key of the wrong type is refused before the first write: the pieces, the splits, the
-- active hash and the counters were read above, and so was the lease index but in
-- 'fail' mode, where it is the first key written (its own refusal writes nothing); the
-- pending set, and for a partition that fails the partitions' lease index and pending
-- set, which nothing reads, are checked.
if nb > 0 or nf > 0 then expect_type(KEYS[2], 'zset') end
if nf > 0 then
  expect_type(KEYS[6], 'zset')
  expect_type(KEYS[7], 'zset')
end

-- Writes, everything checked.
if #stale > 0 then variadic('ZREM', KEYS[3], stale) end
local out, records, pending, done, no = {}, {}, {}, {}, 0
for i = 1, nb do
  local key, r, ready, pid = back[i][1], back[i][2], back[i][3], back[i][4]
  if not reason[pid] then
    no = no + 1
    out[no] = key
    done[no] = key
    records[2 * no - 1], records[2 * no] = key, encode(r)
    pending[2 * no - 1], pending[2 * no] = ready, key
  end
end
if no > 0 then
  variadic('ZREM', KEYS[3], done)
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[2], pending)
end
for j = 1, nf do
  local pid, e, p, gone, from = plans[j][1], plans[j][2], plans[j][3], plans[j][4], plans[j][5]
  variadic('ZREM', KEYS[3], gone)
  variadic('HDEL', KEYS[1], gone)
  variadic('ZREM', KEYS[2], gone)
  redis.call('HDEL', KEYS[4], pid)
  if p and p[1] ~= 'd' then
    moved(p[1], 'f')
    p[1], p[4], p[7], p[12] = 'f', '', now, reason[pid]
    p[9], p[10], p[11] = e[9], e[10], from
    redis.call('HSET', KEYS[5], pid, encode(p))
    redis.call('ZREM', KEYS[6], pid)
    redis.call('ZREM', KEYS[7], pid)
  elseif p then
    p[9], p[10], p[11] = e[9], e[10], from
    redis.call('HSET', KEYS[5], pid, encode(p))
  end
end
if nf > 0 then count(KEYS[8]) end
if given then
  if nf > 0 then return {OK, -1} end
  return {OK, tonumber(back[1][3])}
end
return out
