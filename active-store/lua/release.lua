-- release: give leases back before their deadline (graceful shutdown), keeping each
-- checkpoint so the next claimant resumes where this one stopped. A released attempt is
-- given back (attempts - 1): the worker stopped on purpose, so an interrupted attempt
-- does not count toward max_attempts. (An expired lease, reaped, keeps its attempt: it
-- may be a crash loop.) A checkpoint never moves backwards: an older one than the
-- record holds keeps the record's.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] now ms, then per lease: pid, token, progress (empty: keep the stored one)
-- Reply: per lease, OK or LOST.
entries(1, 3, true)
local now = ARGV[1]
num(now, 'now')
local pids, n = {}, 0
for i = 2, #ARGV, 3 do
  n = n + 1
  pids[n] = id(ARGV[i], 'pid')
  id(ARGV[i + 1], 'token')
  opt_id(ARGV[i + 2], 'progress')
end
local recs = redis.call('HMGET', KEYS[1], unpack(pids))
read_counts(KEYS[4])
-- Every record is decoded and checked, and every change computed, before the first
-- write.
local seen = {}
local out, records, done, ready, nd = {}, {}, {}, {}, 0
for i = 1, n do
  local pid, token, progress = pids[i], ARGV[3 * i], ARGV[3 * i + 1]
  -- A pid named twice meets the record as the first mention left it.
  local r = seen[pid] or (recs[i] and checked(KEYS[1], pid, recs[i]))
  if r then seen[pid] = r end
  if leased(r, token) then
    moved(r[1], 'p')
    r[1] = 'p'
    r[2] = int(math.max(tonumber(r[2]) - 1, 0))
    r[4] = ''
    r[7] = now
    r[11] = later(r[11], progress)
    nd = nd + 1
    done[nd] = pid
    records[2 * nd - 1], records[2 * nd] = pid, encode(r)
    ready[2 * nd - 1], ready[2 * nd] = now, pid
    out[i] = OK
  else
    out[i] = LOST
  end
end
-- A key of the wrong type is refused before the first write: the active hash and the
-- counters were read above, the lease index is written first (its own refusal writes
-- nothing), and the pending set, which nothing reads, is checked.
if nd > 0 then
  expect_type(KEYS[3], 'zset')
  variadic('ZREM', KEYS[2], done)
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[3], ready)
  count(KEYS[4])
end
return out
