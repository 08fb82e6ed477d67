-- heartbeat: renew leases and store their checkpoints, for any number of leases of one
-- shard in one round trip.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] status counters hash
-- ARGV[1] now ms   ARGV[2] new deadline ms, then per lease: pid, token, progress
--      (progress empty: keep the stored checkpoint)
-- Reply: per lease, OK or LOST.
-- A checkpoint never moves backwards: a beat carrying an older one than the record holds
-- (beats reordered or retried) keeps the newer one, and still renews the lease.
entries(2, 3, true)
local now, deadline = ARGV[1], ARGV[2]
num(now, 'now')
num(deadline, 'deadline')
local pids, n = {}, 0
for i = 3, #ARGV, 3 do
  n = n + 1
  pids[n] = id(ARGV[i], 'pid')
  id(ARGV[i + 1], 'token')
  opt_id(ARGV[i + 2], 'progress')
end
local recs = redis.call('HMGET', KEYS[1], unpack(pids))
-- Every record is decoded and checked before the first write.
local seen, moving = {}, false
local out, records, scores, nr = {}, {}, {}, 0
for i = 1, n do
  local pid, token, progress = pids[i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  -- A pid named twice meets the record as the first mention left it.
  local r = seen[pid] or (recs[i] and checked(KEYS[1], pid, recs[i]))
  if r then seen[pid] = r end
  if leased(r, token) then
    if r[1] == 'c' then
      moved('c', 'r')
      moving = true
    end
    r[1] = 'r'
    r[4] = deadline
    r[7] = now
    r[11] = later(r[11], progress)
    records[nr + 1], records[nr + 2] = pid, encode(r)
    scores[nr + 1], scores[nr + 2] = deadline, pid
    nr = nr + 2
    out[i] = OK
  else
    out[i] = LOST
  end
end
-- The counters are read (and checked) only when a status moves: a beat of running
-- leases, the common one, costs no read of them.
if moving then read_counts(KEYS[3]) end
if nr > 0 then
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[2], scores)
  if moving then count(KEYS[3]) end
end
return out
