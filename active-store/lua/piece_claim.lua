-- piece_claim: hand out up to n pending pieces of one shard (split.lua) to a worker.
-- KEYS[1] pieces hash   KEYS[2] piece_pending zset   KEYS[3] piece_leases zset
--      KEYS[4] token sequence
-- ARGV[1] worker   ARGV[2] n   ARGV[3] now ms   ARGV[4] deadline ms
-- Reply: per piece, (pid, start, token, attempts, last ID, progress).
-- Tokens come from the shard's sequence, as claim.lua's do (`reserve_tokens`,
-- common.lua), so a piece's token is never any other lease's.
if #ARGV ~= 4 then refuse('argument count', #ARGV) end
local worker, want = worker_id(ARGV[1], 'worker'), pos(ARGV[2], 'n')
local now, deadline = ARGV[3], ARGV[4]
num(now, 'now')
num(deadline, 'deadline')
if want > 1000 then refuse('n', ARGV[2]) end
local ready = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, want)
if #ready == 0 then return {} end
local recs = redis.call('HMGET', KEYS[1], unpack(ready))
local take, nt = {}, 0
for i, key in ipairs(ready) do
  if recs[i] then
    local r = checked(KEYS[1], key, recs[i])
    if r[1] == 'p' then
      local pid, start = piece_key(key, 'piece')
      nt = nt + 1
      take[nt] = {key, r, pid, start}
    end
  end
end
-- A key of the wrong type is refused before the first write: the pending set and the
-- pieces were read above, the token sequence is written first (its own refusal writes
-- nothing), and the lease index, which nothing reads, is checked.
if nt > 0 then expect_type(KEYS[3], 'zset') end
local token = reserve_tokens(KEYS[4], nt + 1)
variadic('ZREM', KEYS[2], ready)
local out, records, scores = {}, {}, {}
for i = 1, nt do
  local key, r, pid, start = take[i][1], take[i][2], take[i][3], take[i][4]
  token = token + 1
  r[1], r[2], r[3], r[4], r[6], r[7], r[8] = 'c', int(tonumber(r[2]) + 1), int(token), deadline, now, now, worker
  records[2 * i - 1], records[2 * i] = key, encode(r)
  scores[2 * i - 1], scores[2 * i] = deadline, key
  local o = 6 * (i - 1)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = pid, start, r[3], r[2], r[10], r[11]
end
if nt > 0 then
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[3], scores)
end
return out
