-- heartbeat: renew leases and store their checkpoints, for any number of leases of one
-- shard in one round trip.
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] status counters hash
-- ARGV[1] now ms   ARGV[2] new deadline ms, then per lease: pid, token, progress
--      (progress empty: keep the stored checkpoint)
-- Reply: per lease, OK or LOST.
local now, deadline = ARGV[1], ARGV[2]
local pids = {}
for i = 3, #ARGV, 3 do pids[#pids + 1] = ARGV[i] end
local recs = redis.call('HMGET', KEYS[1], unpack(pids))
local out, records, scores = {}, {}, {}
for i, pid in ipairs(pids) do
  local token, progress = ARGV[3 * i + 1], ARGV[3 * i + 2]
  local r = decode(recs[i] or '')
  if leased(r, token) then
    if r[1] == 'c' then moved('c', 'r') end
    r[1] = 'r'
    r[4] = deadline
    r[7] = now
    if progress ~= '' then r[11] = progress end
    records[#records + 1] = pid
    records[#records + 1] = encode(r)
    scores[#scores + 1] = deadline
    scores[#scores + 1] = pid
    out[i] = OK
  else
    out[i] = LOST
  end
end
if #records > 0 then
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[2], scores)
  count(KEYS[3])
end
return out
