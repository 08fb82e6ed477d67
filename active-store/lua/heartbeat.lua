-- heartbeat: renew leases and store their checkpoints, for any number of leases of one
-- shard in one round trip; a lease whose partition was asked to split is cut here, in
-- its holder's own call (split.lua).
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] status counters hash
--      KEYS[4] splits hash   KEYS[5] pieces hash   KEYS[6] piece_pending zset
--      KEYS[7] runs hash
-- ARGV[1] now ms   ARGV[2] new deadline ms, then per lease: pid, token, progress
--      (progress empty: keep the stored checkpoint), next (the first ID the holder has
--      not handed out; empty: the holder does not split, and no cut is made)
-- Reply: per lease, '1' (renewed, its range as planned: never cut), '>' and its last ID
-- (renewed; the record names its end, which an earlier call's cut may have moved), '-1'
-- (lost), '=' and the lease's new last ID (renewed and cut in this call: every ID after
-- it is a pending piece now), or '!' and the error naming its
-- record, which does not decode, or its run, when it has no record of its own and the
-- run its token names does not decode (left as it is; the other leases are renewed).
-- A checkpoint never moves backwards: a beat carrying an older one than the record holds
-- (beats reordered or retried) keeps the newer one, and still renews the lease.
-- A pid its run still holds (runs.lua) leaves the run here: the beat renews the record
-- the run stood for, written as the pid's own with its own lease entry (carve.lua's
-- move, found by the beat's token instead of a read of every run).
entries(2, 4, true)
local now, deadline = ARGV[1], ARGV[2]
num(now, 'now')
num(deadline, 'deadline')
local pids, n, splitting = {}, 0, false
for i = 3, #ARGV, 4 do
  n = n + 1
  pids[n] = id(ARGV[i], 'pid')
  id(ARGV[i + 1], 'token')
  opt_id(ARGV[i + 2], 'progress')
  if opt_id(ARGV[i + 3], 'next') ~= '' then splitting = true end
end
local recs = redis.call('HMGET', KEYS[1], unpack(pids))
-- The pids without a record, looked for in the runs their tokens name.
local wanted, tokens, nw = {}, {}, 0
for i = 1, n do
  if not recs[i] then
    nw = nw + 1
    wanted[nw], tokens[nw] = i, ARGV[4 * i]
  end
end
-- A run that does not decode is never written over: the pids that name it answer its
-- error (`broken`, by token; `runbad`, by lease) and the run is not `touched`.
local runs, broken, runbad, touched, left = {}, {}, {}, {}, false
if nw > 0 then
  local raw = redis.call('HMGET', KEYS[7], unpack(tokens))
  for j = 1, nw do
    local t = tokens[j]
    local u = runs[t]
    if raw[j] and not u and not broken[t] then
      u, broken[t] = run_decode_or(KEYS[7], t, raw[j])
    end
    if broken[t] then
      runbad[wanted[j]] = broken[t]
    elseif u then
      runs[t] = u
      local i = wanted[j]
      local k = run_holds(u, tonumber(pids[i]))
      if k then
        recs[i] = run_record(u, t)
        run_leave(u, k)
        touched[t], left = u, true
      end
    end
  end
end
-- Split entries are read only when a holder that splits beats on a shard that has any.
local ents = {}
if splitting and redis.call('HLEN', KEYS[4]) > 0 then
  ents = redis.call('HMGET', KEYS[4], unpack(pids))
end
-- Every record is decoded and checked before the first write.
local seen, moving = {}, false
local out, records, scores, nr = {}, {}, {}, 0
local entries_out, pieces, pending, ne, np = {}, {}, {}, 0, 0
for i = 1, n do
  local pid, token, progress, next = pids[i], ARGV[4 * i], ARGV[4 * i + 1], ARGV[4 * i + 2]
  -- A pid named twice meets the record as the first mention left it.
  local r, bad = seen[pid], nil
  if not r and recs[i] then
    r, bad = checked_or(KEYS[1], pid, recs[i])
  elseif not r then
    bad = runbad[i]
  end
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
    -- The end answered on every beat, not only the one that cuts: a cut whose reply was
    -- lost is not made again when the beat is retried, and the holder must still learn
    -- where its range ends.
    out[i] = r[10] ~= '' and '>' .. r[10] or '1'
    if ents[i] and not seen[pid .. ':split'] then
      seen[pid .. ':split'] = true
      local e = split_decode(KEYS[4], pid, ents[i])
      if e[1] == 'o' and next ~= '' then
        local cuts = cut(e, 'o', r, r[10] ~= '' and r[10] or e[10], next, now)
        for _, c in ipairs(cuts) do
          pieces[np + 1], pieces[np + 2] = pid .. ':' .. c[1], encode(c[2])
          pending[np + 1], pending[np + 2] = now, pid .. ':' .. c[1]
          np = np + 2
          out[i] = '=' .. r[10]
        end
        entries_out[ne + 1], entries_out[ne + 2], ne = pid, split_encode(e), ne + 2
      end
    end
    records[nr + 1], records[nr + 2] = pid, encode(r)
    scores[nr + 1], scores[nr + 2] = deadline, pid
    nr = nr + 2
  elseif bad then
    out[i] = '!' .. bad
  else
    out[i] = '-1'
  end
end
-- The counters are read (and checked) only when a status moves: a beat of running
-- leases, the common one, costs no read of them.
if moving then read_counts(KEYS[3]) end
-- A key of the wrong type is refused before the first write: every key written here was
-- read above (its read fails first) but the lease index, written first (its own refusal
-- writes nothing), and the pieces of a cut, checked (`expect_type`) only when a beat
-- cuts.
if np > 0 then
  expect_type(KEYS[5], 'hash')
  expect_type(KEYS[6], 'zset')
end
if nr > 0 then
  variadic('ZADD', KEYS[2], scores)
  variadic('HSET', KEYS[1], records)
  if moving then count(KEYS[3]) end
end
if ne > 0 then variadic('HSET', KEYS[4], entries_out) end
if np > 0 then
  variadic('HSET', KEYS[5], pieces)
  variadic('ZADD', KEYS[6], pending)
end
if left then variadic('ZREM', KEYS[2], runs_store(KEYS[7], touched)) end
return out
