-- complete: finish any number of leases of one shard in one round trip (group commit).
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] completed-index bitmap
--      KEYS[4] inbox stream   KEYS[5] status counters hash   KEYS[6] splits hash
--      KEYS[7] runs hash   KEYS[8] pending zset
-- ARGV per entry: pid, token, bit offset in the index, then its completed record; or,
--      for a run of consecutive pids under one token (a group), the first pid, the
--      token, the first pid's bit offset and the group's records in pid order joined by
--      '\n': an entry of k lines stands for pids pid .. pid + k - 1 at bit offsets bit ..
--      bit + k - 1 (k at most MAX_RUN). The reply has one code per pid, in that order.
--      A single entry of a lease its holder was told is cut (its last ID below its
--      partition's planned one) carries that last ID before its record: `<` last `|`
--      record.
-- Reply: per pid, OK, DUPLICATE, LOST, PART (2: the owner part of a split partition is
-- done, its pieces are not, so the partition is not completed), CORRUPT (-2: its
-- record, not held, does not decode; left as it is, the other pids go on) or
-- CORRUPT_RUN (-3: it has no record of its own, and the run its token names does not
-- decode; the run is left as it is, no bit of it set, and the other pids go on).
-- A split partition (split.lua) with pieces outstanding is not finished by its owner:
-- the owner part is marked done, its lease ends, and the partition stays, running,
-- until its last piece completes it (piece_complete.lua). With none outstanding, the
-- completion is the ordinary one, its record the partition's whole span.
-- A lease told it was cut whose record ends later (`short`): the cut it was told of is
-- not in the store, acknowledged and then lost (a failover to a replica that had not
-- seen it). Completing would skip the IDs past its last one, which no piece holds: its
-- record is pending again instead, from that last ID + 1, the attempt given back (as a
-- release), and the reply is PART. (A pid of a run, which a cut never meets, answers
-- LOST: its run's lease expires and is reclaimed whole.)
-- A pid its run still holds (runs.lua) is completed in the run: it leaves the run's mask,
-- and the run's field and lease entry go with its last pid; its record was never
-- written, so nothing else is removed. Any other pid is completed in its own record.
-- A group whose pids its run still holds, every one (the pipeline's common case), is
-- completed in bulk: one slice of the run's mask, a BITFIELD SET of up to 32 bits at a
-- time, and its records passed to the inbox as sent, none split or copied; any other
-- group is taken apart into single completions.
-- Every argument is checked before the first write (the BITFIELD, or the SET that grows
-- a large index first). Every command
-- runs once per call, not once per completion: a batch of 30 costs little more than a
-- batch of one.
local PART, CORRUPT, CORRUPT_RUN = 2, -2, -3

-- The cases a completion ends in, one named function each, and the writes they add up
-- to. Each takes the call's accumulator `a` (the reply and every write to make, built
-- by `new_acc`) and what it needs of its pid as arguments: none reaches the call's
-- other locals. Redis runs the script's body on every call, so a function that
-- captured them would be a new closure with new upvalues each time (some 47% more per
-- call, measured); these capture only the preludes' functions and constants.
local function new_acc()
  return {
    out = {},
    -- Records for the inbox, one line each, and the pids that leave the hot set.
    records = {}, nrec = 0, done = {}, nd = 0,
    -- Owner parts done with pieces out (pid, record) and split entries to write
    -- (pid, entry; nil: delete): tables of their own only when the shard has split
    -- entries (`ents`).
    parts = false, np = 0, split_done = false, ns = 0,
    -- Leases told of a lost cut made pending again: records and pending entries, as
    -- HSET and ZADD arguments, and the pids done so.
    -- Tables of their own only when there are some (`short`).
    back = false, ready = false, nback = 0, backed = false,
    -- Completions by the status they leave (claimed, running), counted once at the end.
    from_c = 0, from_r = 0,
    -- The runs that lose pids, by token, and whether any does.
    touched = {}, left = false,
  }
end

-- Case 1: a group held whole by its run, out of it already, whatever its bits say. Its
-- records go to the inbox as sent when every bit was clear, else line by line. `at`:
-- the reply of BITFIELD before its first field; returns its last.
local function group_done(a, rec, k, first, bits, at)
  local out, records = a.out, a.records
  local clear, j = true, 0
  while j < k do
    at = at + 1
    if bits[at] ~= 0 then clear = false end
    j = j + math.min(32, k - j)
  end
  if clear then
    a.nrec = a.nrec + 1
    records[a.nrec] = rec
    for i = 0, k - 1 do out[first + i] = OK end
  else
    -- Some completed before (a retry, a restore): bit j of a field of w bits is its
    -- (w - j)th lowest.
    local from, f, w, v, base = 1, at - math.ceil(k / 32), 0, 0, 0
    for i = 0, k - 1 do
      if i == base + w then
        f, base, w = f + 1, i, math.min(32, k - i)
        v = bits[f]
      end
      local to = string.find(rec, '\n', from, true)
      if math.floor(v / 2 ^ (w - 1 - (i - base))) % 2 == 1 then
        out[first + i] = DUPLICATE
      else
        a.nrec = a.nrec + 1
        records[a.nrec] = string.sub(rec, from, (to or 0) - 1)
        out[first + i] = OK
      end
      from = (to or 0) + 1
    end
  end
  a.from_c = a.from_c + k
  return at
end

-- Case 2: the owner part of a split partition with pieces outstanding is done. The
-- record stays running with no lease (no token to present); the last piece completes
-- the partition.
local function part_done(a, pid, r, e, slot)
  r[3], r[4] = '', ''
  e[7] = '1'
  unrequest(e)
  a.parts[a.np + 1], a.parts[a.np + 2], a.np = pid, encode(r), a.np + 2
  a.split_done[a.ns + 1], a.split_done[a.ns + 2], a.ns = pid, split_encode(e), a.ns + 2
  a.out[slot] = PART
end

-- Case 3: a pid its run holds (position k in run u) leaves it whatever its bit says (a
-- set bit: completed before, a restore). A pid named twice in one call leaves, and is
-- counted, once.
local function run_done(a, u, k, token, rec, set, slot)
  if string.byte(u[5], k) == 99 then
    run_leave(u, k)
    a.touched[token], a.left = u, true
    a.from_c = a.from_c + 1
  end
  if set then
    a.out[slot] = DUPLICATE
  else
    a.nrec = a.nrec + 1
    a.records[a.nrec] = rec
    a.out[slot] = OK
  end
end

-- Case 4: a lease told of a cut the store does not hold (`short`): its record r is
-- pending again from its last ID + 1 at `at` ms, its attempt given back, as
-- release.lua does.
local function cut_lost(a, pid, r, at, last, slot)
  a.out[slot] = PART
  if a.backed[pid] then return end
  a.backed[pid] = true
  at = int(at)
  moved(r[1], 'p')
  r[1], r[2], r[4], r[7] = 'p', int(math.max(tonumber(r[2]) - 1, 0)), '', at
  r[11] = later(r[11], succ(last))
  local nb = a.nback
  a.back[nb + 1], a.back[nb + 2] = pid, encode(r)
  a.ready[nb + 1], a.ready[nb + 2] = at, pid
  a.nback = nb + 2
end

-- Case 5: a lease held to its end completes: out of the hot set, its record to the
-- inbox (`final`, the whole partition's, when it was split and every piece is done:
-- its split entry goes too). `status`: 'c' or 'r', the status it leaves.
local function held_done(a, pid, rec, final, status, slot)
  a.nd, a.nrec = a.nd + 1, a.nrec + 1
  a.done[a.nd], a.records[a.nrec] = pid, final or rec
  if final then
    a.split_done[a.ns + 1], a.split_done[a.ns + 2], a.ns = pid, nil, a.ns + 2
  end
  if status == 'c' then a.from_c = a.from_c + 1 else a.from_r = a.from_r + 1 end
  a.out[slot] = OK
end

-- Every write the cases add up to, after the last of them.
local function write(a)
  if a.from_c > 0 then moved('c', nil, a.from_c) end
  if a.from_r > 0 then moved('r', nil, a.from_r) end
  if a.nrec > 0 then
    -- Remove from the hot set, mark done (above) and hand the records to the archiver,
    -- in one atomic step: the inbox stream is durable, so nothing is lost between
    -- layers. One stream entry carries the whole batch, one record per line.
    if a.nd > 0 then
      variadic('HDEL', KEYS[1], a.done)
      variadic('ZREM', KEYS[2], a.done)
    end
    redis.call('XADD', KEYS[4], '*', 'r', table.concat(a.records, '\n'))
  end
  if a.from_c > 0 or a.from_r > 0 or a.nback > 0 then count(KEYS[5]) end
  if a.nback > 0 then
    variadic('HSET', KEYS[1], a.back)
    local gone = {}
    for i = 1, a.nback, 2 do gone[(i + 1) / 2] = a.back[i] end
    variadic('ZREM', KEYS[2], gone)
    variadic('ZADD', KEYS[8], a.ready)
  end
  if a.left then variadic('ZREM', KEYS[2], runs_store(KEYS[7], a.touched)) end
  if a.np > 0 then
    variadic('HSET', KEYS[1], a.parts)
    local gone = {}
    for i = 1, a.np, 2 do gone[(i + 1) / 2] = a.parts[i] end
    variadic('ZREM', KEYS[2], gone)
  end
  for i = 1, a.ns, 2 do
    if a.split_done[i + 1] then
      redis.call('HSET', KEYS[6], a.split_done[i], a.split_done[i + 1])
    else
      redis.call('HDEL', KEYS[6], a.split_done[i])
    end
  end
end

entries(0, 4, true)
local m = #ARGV / 4
local format = string.format
-- Single completions (i = 1..n): pid, token, bit (strings), record, reply slot, and
-- the last ID of a lease told it was cut (else nil).
local pids, tokens, sbits, srecs, slot, lasts = {}, {}, {}, {}, {}, false
local n = 0
-- Groups (g = 1..ng): first pid and first bit (numbers), count, reply slot of the first.
local gfirst, gtoken, gbit, gcount, grecs, gslot = {}, {}, {}, {}, {}, {}
local ng, nslots = 0, 0
for e = 1, m do
  local pid, token, bit, rec = ARGV[4 * e - 3], ARGV[4 * e - 2], ARGV[4 * e - 1], ARGV[4 * e]
  -- The common case in one match: three nonzero IDs of at most 19 digits. Anything else
  -- (a zero, 20 digits, or a bad one) goes through `id` one by one, which names it.
  if not (#pid < 20 and #token < 20 and #bit < 20
      and string.find(pid .. ' ' .. token .. ' ' .. bit, '^[1-9]%d* [1-9]%d* [1-9]%d*$')) then
    id(pid, 'pid')
    id(token, 'token')
    id(bit, 'bit offset')
  end
  if rec == '' then refuse('completed record', rec) end
  local last
  if string.byte(rec, 1) == 60 then
    local bar = string.find(rec, '|', 2, true)
    last = id(bar and string.sub(rec, 2, bar - 1) or '', 'last ID')
    rec = string.sub(rec, bar + 1)
    if rec == '' or string.find(rec, '\n', 1, true) then refuse('completed record', rec) end
  end
  -- The inbox entry holds one record per line.
  if not string.find(rec, '\n', 1, true) then
    n, nslots = n + 1, nslots + 1
    pids[n], tokens[n], sbits[n], srecs[n], slot[n] = pid, token, bit, rec, nslots
    if last then
      lasts = lasts or {}
      lasts[n] = last
    end
  else
    -- Its lines counted by plain finds (a pattern would step through every byte in
    -- Lua): none empty, at most MAX_RUN.
    local k, from = 1, 1
    while true do
      local to = string.find(rec, '\n', from, true)
      if to == from or to == #rec or k > MAX_RUN then refuse('completed records', rec) end
      if not to then break end
      k, from = k + 1, to + 1
    end
    local first, b = tonumber(pid), tonumber(bit)
    -- pids and bit offsets stay exact (below 2^53) to the group's end.
    if first + k > 9007199254740992 or b + k > 9007199254740992 then
      refuse('pid', pid)
    end
    ng = ng + 1
    gfirst[ng], gtoken[ng], gbit[ng], gcount[ng], grecs[ng], gslot[ng] =
      first, token, b, k, rec, nslots + 1
    nslots = nslots + k
  end
end
-- Runs first: a completion's token names its run, if the pid is in one. Each run is
-- read and decoded once; the pids no run holds are read from the active hash. A run
-- that does not decode (`broken`) holds none as far as this call can tell: its pids are
-- read from the active hash too, a group of them taken apart, and the run is never
-- written (only a decoded run is `touched`). A pid with a record of its own left its
-- run for good and is completed by its record; one without answers CORRUPT_RUN (or
-- DUPLICATE when its bit is set, as a corrupt record does: it completed before).
local want, nwant, seen = {}, 0, {}
for i = 1, n do
  if not seen[tokens[i]] then nwant, seen[tokens[i]] = nwant + 1, true; want[nwant] = tokens[i] end
end
for g = 1, ng do
  if not seen[gtoken[g]] then nwant, seen[gtoken[g]] = nwant + 1, true; want[nwant] = gtoken[g] end
end
local runs_raw = redis.call('HMGET', KEYS[7], unpack(want))
local runs, broken = {}, {}
for j = 1, nwant do
  if runs_raw[j] then
    local u = run_decode_or(KEYS[7], want[j], runs_raw[j])
    if u then runs[want[j]] = u else broken[want[j]] = true end
  end
end
-- The runs that lose pids in this call, by token.
local acc = new_acc()
local touched = acc.touched
-- Groups held whole leave their run here (in the decoded run; written after the
-- checks); the rest become single completions.
local bulk, nb = {}, 0
for g = 1, ng do
  local u, k = runs[gtoken[g]], gcount[g]
  local at = u and gfirst[g] - u[7] + 1
  if at and at >= 1 and at + k - 1 <= #u[5]
      and string.sub(u[5], at, at + k - 1) == string.sub(FULL_MASK, 1, k) then
    u[5] = string.sub(u[5], 1, at - 1) .. string.sub(EMPTY_MASK, 1, k) .. string.sub(u[5], at + k)
    touched[gtoken[g]], acc.left = u, true
    nb = nb + 1
    bulk[nb] = g
  else
    local rec, from = grecs[g], 1
    for j = 0, k - 1 do
      local to = string.find(rec, '\n', from, true)
      n = n + 1
      pids[n], tokens[n] = format('%d', gfirst[g] + j), gtoken[g]
      sbits[n], srecs[n] = format('%d', gbit[g] + j), string.sub(rec, from, (to or 0) - 1)
      slot[n] = gslot[g] + j
      from = (to or 0) + 1
    end
  end
end
local in_run = {}
local rest, nrest = {}, 0
for i = 1, n do
  local u = runs[tokens[i]]
  local k = u and run_holds(u, tonumber(pids[i]))
  if k then
    in_run[i] = k
  else
    nrest = nrest + 1
    rest[nrest] = pids[i]
  end
end
local recs = {}
if nrest > 0 then
  local got = redis.call('HMGET', KEYS[1], unpack(rest))
  local j = 0
  for i = 1, n do
    if not in_run[i] then
      j = j + 1
      recs[i] = got[j]
    end
  end
end
-- Split entries, read only when the shard has any; without them (`ents` false) the
-- tables that serve split partitions are not built either: every table a call makes
-- costs about as much as a check.
local ents = false
if n > 0 and redis.call('HLEN', KEYS[6]) > 0 then
  ents = {}
  acc.parts, acc.split_done = {}, {}
  local raw = redis.call('HMGET', KEYS[6], unpack(pids))
  for i = 1, n do
    if raw[i] then ents[i] = split_decode(KEYS[6], pids[i], raw[i]) end
  end
end

-- One BITFIELD for the whole batch: held leases set their bit (and read the old one);
-- the others only read theirs, to tell a duplicate from a lost lease. A record not held
-- is checked (off the hot path): a corrupt one is reported CORRUPT, not lost.
local ops, held, no, holding, bad = {}, {}, 0, false, {}
-- Whether an owner part ends with pieces out (its lease entry goes, its bit stays clear).
local parting = false
-- Leases told of a cut the store does not have (`short`, by i: the record, and when).
local short, short_at = false, false
local partrec, finals = ents and {}, ents and {}
-- The highest bit a held lease sets, looked at only for offsets of six digits or more:
-- below 524,280 the bitmap is under 64 KB, and Redis grows it (`grow_bitmap`).
local top = -1
for i = 1, n do
  local bit = sbits[i]
  -- A pid its run holds is claimed, never split (a split carves it out first).
  if in_run[i] then
    held[i] = 'c'
    if ents then ents[i] = nil end
  else
    held[i] = holds(recs[i], tokens[i])
  end
  if held[i] and lasts and lasts[i] then
    if in_run[i] then
      held[i], in_run[i] = nil, nil
    else
      local r = checked_or(KEYS[1], pids[i], recs[i])
      if not r then
        held[i], bad[i] = nil, true
      elseif r[10] == '' or id_lt(lasts[i], r[10]) then
        local at = ms_of(string.match(srecs[i], '"completed_at":([%d.]+)') or '')
        if not at then refuse('completed record', srecs[i]) end
        short, short_at = short or {}, short_at or {}
        held[i], short[i], short_at[i] = nil, r, at
      end
    end
  end
  local part = held[i] and ents and ents[i] and ents[i][6] ~= '0'
  if part then
    partrec[i], bad[i] = checked_or(KEYS[1], pids[i], recs[i])
    if bad[i] then held[i], part = nil, false end
  end
  if part then
    -- The owner part of a partition with pieces outstanding: its bit stays clear.
    ops[no + 1], ops[no + 2], ops[no + 3] = 'GET', 'u1', bit
    no = no + 3
    parting = true
  elseif held[i] then
    if ents and ents[i] then
      -- Split, every piece done: the record spans the partition, from its first claim.
      local at = ms_of(string.match(srecs[i], '"completed_at":([%d.]+)') or '')
      if not at then refuse('completed record', srecs[i]) end
      finals[i] = finished_record(ents[i], at)
    end
    ops[no + 1], ops[no + 2], ops[no + 3], ops[no + 4] = 'SET', 'u1', bit, 1
    no = no + 4
    holding = true
    if #bit >= 6 and tonumber(bit) > top then top = tonumber(bit) end
  else
    if recs[i] and not bad[i] then
      local _
      _, bad[i] = checked_or(KEYS[1], pids[i], recs[i])
    end
    ops[no + 1], ops[no + 2], ops[no + 3] = 'GET', 'u1', bit
    no = no + 3
  end
end
-- Then the groups held whole: their bits set up to 32 at a time (exact as Lua numbers),
-- each field's old value read back (set bits: completed before).
local fields = {}
for b = 1, nb do
  local g = bulk[b]
  local off, k = gbit[g], gcount[g]
  while k > 0 do
    local w = math.min(32, k)
    ops[no + 1], ops[no + 2], ops[no + 3], ops[no + 4] = 'SET', 'u' .. w, format('%d', off), 2 ^ w - 1
    no = no + 4
    k, off = k - w, off + w
  end
  holding = true
  if off - 1 > top then top = off - 1 end
end
-- The counters of the statuses a completion moves (claimed and running), read and
-- checked only when a lease is held to its end: otherwise no status moves.
if short then
  acc.back, acc.ready, acc.backed = {}, {}, {}
  read_counts(KEYS[5], {'p', 'c', 'r'})
elseif holding then
  read_counts(KEYS[5], {'c', 'r'})
end
-- A key of the wrong type is refused before the first write: the index is written
-- first (its own refusal writes nothing), the active, runs and splits hashes and the
-- counters were read above (a read fails first); the lease index and the inbox, which
-- nothing reads, are checked (`expect_type`) when a lease ends, and the pending set
-- when a lease goes back to it.
if holding or short or parting then
  expect_type(KEYS[2], 'zset')
  if holding then expect_type(KEYS[4], 'stream') end
  if short then expect_type(KEYS[8], 'zset') end
end
-- Every check done: the index grown to hold the highest bit (`grow_bitmap`,
-- common.lua), as archive.lua grows the archived bitmap.
grow_bitmap(KEYS[3], top)
local bits = redis.call('BITFIELD', KEYS[3], unpack(ops))

local a = acc
local out = a.out
local at = n
for b = 1, nb do
  local g = bulk[b]
  at = group_done(a, grecs[g], gcount[g], gslot[g], bits, at)
end
for i = 1, n do
  local e = ents and ents[i]
  if held[i] and e and e[6] ~= '0' and bits[i] ~= 1 then
    part_done(a, pids[i], partrec[i], e, slot[i])
  elseif in_run[i] then
    run_done(a, runs[tokens[i]], in_run[i], tokens[i], srecs[i], bits[i] == 1, slot[i])
  elseif bits[i] == 1 then
    -- Idempotency: the index bit is set exactly once per pid, so a retried or late
    -- completion changes nothing and reaches the inbox (and the statistics) only once.
    out[slot[i]] = DUPLICATE
  elseif short and short[i] then
    cut_lost(a, pids[i], short[i], short_at[i], lasts[i], slot[i])
  elseif held[i] then
    held_done(a, pids[i], srecs[i], e and finals[i], held[i], slot[i])
  elseif bad[i] then
    out[slot[i]] = CORRUPT
  elseif not recs[i] and broken[tokens[i]] then
    out[slot[i]] = CORRUPT_RUN
  else
    out[slot[i]] = LOST
  end
end
write(a)
return out
