-- reap: return expired leases of one shard to pending, checkpoint kept. Only the lease
-- index up to now is read (seed 001's time buckets, as a sorted set), so the cost is the
-- number of expired leases, not the size of the active set. Idempotent: any number of
-- reapers may run.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash   KEYS[5] splits hash   KEYS[6] pieces hash
--      KEYS[7] piece_pending zset   KEYS[8] piece_leases zset
-- ARGV[1] now ms   ARGV[2] at most this many   ARGV[3] worker (empty: any; otherwise
--      release that worker's leases whatever their deadline, and ARGV[2] is not used)
--      ARGV[4] max attempts
-- Reply: the pids returned to pending. A lease that expired on its last attempt
-- (attempts >= max attempts) is failed instead: a partition that crashes its worker
-- every time must not be retried for ever. A split partition (split.lua) failed so is
-- whole again, as fail.lua makes it: its planned range back, from its lowest unfinished
-- ID; its split entry and every piece gone, a running piece fenced.
-- Every argument and every record met is checked before the first write. A record that
-- does not decode is skipped, left as it is with its lease entry (`check --repair`
-- rebuilds it): one corrupt record never stops a shard's reaping. So is a partition
-- failing here whose split entry or pieces do not decode.
if #ARGV ~= 4 then refuse('argument count', #ARGV) end
local now, limit, worker = ARGV[1], num(ARGV[2], 'limit'), ARGV[3]
num(now, 'now')
if worker ~= '' then worker_id(worker, 'worker') end
local max_attempts = pos(ARGV[4], 'max attempts')
local pids
if worker == '' then
  pids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
else
  pids = redis.call('ZRANGE', KEYS[2], 0, -1)
end
read_counts(KEYS[4])
-- The pieces hash, read once if a split partition fails here.
local all
-- Plans `unsplit` for split partition `pid` (record `r`) failing here: nil if it is not
-- split, else the fields of its pieces, `r` given its planned range and checkpoint.
-- Reads and checks only.
local function whole(pid, r)
  local raw = redis.call('HGET', KEYS[5], pid)
  if not raw then return nil end
  local e = split_decode(KEYS[5], pid, raw)
  all = all or redis.call('HGETALL', KEYS[6])
  local gone, from = unsplit_plan(KEYS[6], all, pid, e, r[11] ~= '' and r[11] or e[9])
  r[9], r[10], r[11] = e[9], e[10], from
  return gone
end
local stale, ns, changes, nc = {}, 0, {}, 0
for _, pid in ipairs(pids) do
  -- Neither the keeper (not a lease, see record.lua; only the whole-index read of a
  -- worker meets it) nor a run's entry ('r' .. token, runs.lua): the client carves a
  -- run's pids out before it reaps, and a run that expired since is reaped next time.
  if pid ~= SKIPLIST_KEEPER and string.byte(pid, 1) ~= 114 then
    local s = redis.call('HGET', KEYS[1], pid)
    if not s then
      -- A lease entry without a record is stale: dropped.
      ns = ns + 1
      stale[ns] = pid
    else
      local ok, r = pcall(checked, KEYS[1], pid, s)
      if ok and (worker == '' or r[8] == worker) then
        local gone
        if tonumber(r[2]) >= max_attempts then
          ok, gone = pcall(whole, pid, r)
          -- A splits or pieces key of the wrong type is the shard's damage, not this
          -- partition's: the call is refused (nothing is written yet).
          if not ok and string.find(type(gone) == 'table' and gone.err or tostring(gone),
              '^WRONGTYPE') then
            error(gone)
          end
        end
        if ok then
          nc = nc + 1
          changes[nc] = {pid, r, gone}
        end
      end
    end
  end
end
-- A key of the wrong type is refused before the first write: the lease index, the
-- counters, the active hash and, for a split partition failing, the splits and pieces
-- hashes were read above; the pending set and the pieces' sets, which nothing reads,
-- are checked when they will be written.
local to_pending, unsplit = false, false
for i = 1, nc do
  if tonumber(changes[i][2][2]) < max_attempts then
    to_pending = true
  elseif changes[i][3] then
    unsplit = true
  end
end
if to_pending then expect_type(KEYS[3], 'zset') end
if unsplit then
  expect_type(KEYS[7], 'zset')
  expect_type(KEYS[8], 'zset')
end
local out, no = {}, 0
for i = 1, ns do redis.call('ZREM', KEYS[2], stale[i]) end
for i = 1, nc do
  local pid, r, gone = changes[i][1], changes[i][2], changes[i][3]
  local attempts = tonumber(r[2])
  r[4] = ''
  r[7] = now
  redis.call('ZREM', KEYS[2], pid)
  if attempts >= max_attempts then
    moved(r[1], 'f')
    r[1] = 'f'
    r[12] = 'lease expired on attempt ' .. r[2] .. ' of ' .. ARGV[4] .. ' (the worker died or stalled)'
    redis.call('HSET', KEYS[1], pid, encode(r))
    if gone then
      variadic('HDEL', KEYS[6], gone)
      variadic('ZREM', KEYS[7], gone)
      variadic('ZREM', KEYS[8], gone)
      redis.call('HDEL', KEYS[5], pid)
    end
  else
    moved(r[1], 'p')
    r[1] = 'p'
    redis.call('HSET', KEYS[1], pid, encode(r))
    redis.call('ZADD', KEYS[3], now, pid)
    no = no + 1
    out[no] = pid
  end
end
count(KEYS[4])
return out
