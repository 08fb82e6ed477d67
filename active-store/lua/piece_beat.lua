-- piece_beat: renew piece leases of one shard and store their checkpoints; a piece asked
-- to split is cut here, in its holder's call (split.lua).
-- KEYS[1] pieces hash   KEYS[2] piece_pending zset   KEYS[3] piece_leases zset
--      KEYS[4] splits hash
-- ARGV[1] now ms   ARGV[2] new deadline ms, then per piece: `pid:start`, token, progress
--      (empty: keep), next (the first ID the holder has not handed out; empty: no cut)
-- Reply: per piece, '>' and its last ID (renewed; an earlier call's cut may have moved
-- it; '1' if the record names none: the lease's own), '-1' (lost), '=' and its new last
-- ID (renewed and cut in this call), or '!' and the error naming its record, which does
-- not decode (left as it is; the other pieces are renewed).
entries(2, 4, true)
local now, deadline = ARGV[1], ARGV[2]
num(now, 'now')
num(deadline, 'deadline')
local keys, pids, n = {}, {}, 0
for i = 3, #ARGV, 4 do
  n = n + 1
  keys[n] = ARGV[i]
  pids[n] = piece_key(ARGV[i], 'piece')
  id(ARGV[i + 1], 'token')
  opt_id(ARGV[i + 2], 'progress')
  opt_id(ARGV[i + 3], 'next')
end
local recs = redis.call('HMGET', KEYS[1], unpack(keys))
local ents = redis.call('HMGET', KEYS[4], unpack(pids))
-- Each partition's entry, decoded once: two pieces of one partition may be in the call,
-- and the request may be for either.
local seen, decoded = {}, {}
local out, records, nr = {}, {}, 0
local entries_out, pending, ne, np = {}, {}, 0, 0
for i = 1, n do
  local key, pid, token, progress, next = keys[i], pids[i], ARGV[4 * i], ARGV[4 * i + 1], ARGV[4 * i + 2]
  local r, bad = seen[key], nil
  if not r and recs[i] then r, bad = checked_or(KEYS[1], key, recs[i]) end
  if r then seen[key] = r end
  if leased(r, token) then
    r[1], r[4], r[7] = 'r', deadline, now
    r[11] = later(r[11], progress)
    -- The end answered on every beat (heartbeat.lua says why).
    out[i] = r[10] ~= '' and '>' .. r[10] or '1'
    if ents[i] then
      local e = decoded[pid] or split_decode(KEYS[4], pid, ents[i])
      decoded[pid] = e
      -- Served once: the cut empties the request, so no later piece matches it.
      if e[1] == r[9] then
        for _, c in ipairs(cut(e, r[9], r, r[10], next, now)) do
          records[nr + 1], records[nr + 2], nr = pid .. ':' .. c[1], encode(c[2]), nr + 2
          pending[np + 1], pending[np + 2], np = now, pid .. ':' .. c[1], np + 2
          out[i] = '=' .. r[10]
        end
        entries_out[ne + 1], entries_out[ne + 2], ne = pid, split_encode(e), ne + 2
      end
    end
    records[nr + 1], records[nr + 2], nr = key, encode(r), nr + 2
  elseif bad then
    out[i] = '!' .. bad
  else
    out[i] = '-1'
  end
end
-- A key of the wrong type is refused before the first write: the pieces and the splits
-- were read above, the lease index is written first (its own refusal writes nothing),
-- and the pending set, which nothing reads, is checked when a beat cuts.
if np > 0 then expect_type(KEYS[2], 'zset') end
if nr > 0 then
  local lease_scores, nl = {}, 0
  for i = 1, nr, 2 do
    local key = records[i]
    if seen[key] then lease_scores[nl + 1], lease_scores[nl + 2], nl = deadline, key, nl + 2 end
  end
  if nl > 0 then variadic('ZADD', KEYS[3], lease_scores) end
  variadic('HSET', KEYS[1], records)
end
if ne > 0 then variadic('HSET', KEYS[4], entries_out) end
if np > 0 then variadic('ZADD', KEYS[2], pending) end
return out
