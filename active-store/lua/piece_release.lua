-- piece_release: the holder gives pieces of one shard back (a graceful stop, a queued
-- piece never started, a command that cannot run), pending again at once from their
-- checkpoint, the attempt given back as release.lua gives a partition's (split.lua). A
-- lease that expired is piece_fail.lua's, which counts the attempt.
-- KEYS[1] pieces hash   KEYS[2] piece_pending zset   KEYS[3] piece_leases zset
-- ARGV[1] now ms, then per piece: `pid:start`, token, progress
-- Reply: the pieces returned to pending.
entries(1, 3, true)
local now = ARGV[1]
num(now, 'now')
local keys, given = {}, {}
for i = 2, #ARGV, 3 do
  keys[#keys + 1] = ARGV[i]
  piece_key(ARGV[i], 'piece')
  given[#given + 1] = {id(ARGV[i + 1], 'token'), id(ARGV[i + 2], 'progress')}
end
local recs = redis.call('HMGET', KEYS[1], unpack(keys))
local back, nb, records, pending = {}, 0, {}, {}
local seen = {}
for i, key in ipairs(keys) do
  -- A piece named twice meets the record as the first mention left it.
  local r = seen[key] or (recs[i] and checked(KEYS[1], key, recs[i]))
  if r then seen[key] = r end
  local g = given[i]
  if leased(r, g[1]) then
    r[11] = later(r[11], g[2])
    r[2] = int(math.max(tonumber(r[2]) - 1, 0))
    r[1], r[4], r[7] = 'p', '', now
    nb = nb + 1
    back[nb] = key
    records[2 * nb - 1], records[2 * nb] = key, encode(r)
    pending[2 * nb - 1], pending[2 * nb] = now, key
  end
end
-- A key of the wrong type is refused before the first write: the pieces were read
-- above, the lease index is written first (its own refusal writes nothing), and the
-- pending set, which nothing reads, is checked.
if nb > 0 then
  expect_type(KEYS[2], 'zset')
  variadic('ZREM', KEYS[3], back)
  variadic('HSET', KEYS[1], records)
  variadic('ZADD', KEYS[2], pending)
end
return back
