-- release: give leases back before their deadline (graceful shutdown), keeping each
-- checkpoint so the next claimant resumes where this one stopped. A released attempt is
-- given back (attempts - 1): the worker stopped on purpose, so an interrupted attempt
-- does not count toward max_attempts. (An expired lease, reaped, keeps its attempt: it
-- may be a crash loop.)
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] pending zset
--      KEYS[4] status counters hash
-- ARGV[1] now ms, then per lease: pid, token, progress (empty: keep the stored one)
-- Reply: per lease, OK or LOST.
local now = ARGV[1]
local out = {}
for i = 2, #ARGV, 3 do
  local pid, token, progress = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local r = decode(redis.call('HGET', KEYS[1], pid) or '')
  if leased(r, token) then
    moved(r[1], 'p')
    r[1] = 'p'
    r[2] = int(math.max(tonumber(r[2]) - 1, 0))
    r[4] = ''
    r[7] = now
    if progress ~= '' then r[11] = progress end
    redis.call('HSET', KEYS[1], pid, encode(r))
    redis.call('ZREM', KEYS[2], pid)
    redis.call('ZADD', KEYS[3], now, pid)
    out[#out + 1] = OK
  else
    out[#out + 1] = LOST
  end
end
count(KEYS[4])
return out
