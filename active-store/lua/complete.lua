-- complete: finish any number of leases of one shard in one round trip (group commit).
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] completed-index bitmap
--      KEYS[4] inbox stream   KEYS[5] status counters hash   KEYS[6] splits hash
--      KEYS[7] runs hash
-- ARGV per entry: pid, token, bit offset in the index, then its completed record; or,
--      for a run of consecutive pids under one token (a group), the first pid, the
--      token, the first pid's bit offset and the group's records in pid order joined by
--      '\n': an entry of k lines stands for pids pid .. pid + k - 1 at bit offsets bit ..
--      bit + k - 1 (k at most MAX_RUN). The reply has one code per pid, in that order.
-- Reply: per pid, OK, DUPLICATE, LOST, PART (2: the owner part of a split partition is
-- done, its pieces are not, so the partition is not completed), CORRUPT (-2: its
-- record, not held, does not decode; left as it is, the other pids go on) or
-- CORRUPT_RUN (-3: it has no record of its own, and the run its token names does not
-- decode; the run is left as it is, no bit of it set, and the other pids go on).
-- Five cases, a function each (`finish_group`, `finish_part`, `finish_in_run`,
-- `finish_held`, `finish_not_held`):
-- * A group whose pids its run (runs.lua) still holds, every one (the pipeline's common
--   case), is completed in bulk: one slice of the run's mask, a BITFIELD SET of up to
--   32 bits at a time, and its records passed to the inbox as sent, none split or
--   copied. Any other group is taken apart into single completions.
-- * The owner part of a split partition (split.lua) with pieces outstanding is not
--   finished by its owner: it is marked done, its lease ends, and the partition stays,
--   running, until its last piece completes it (piece_complete.lua).
-- * A pid its run still holds is completed in the run: it leaves the run's mask, and
--   the run's field and lease entry go with its last pid; its record was never
--   written, so nothing else is removed.
-- * A pid whose own record holds the lease is completed in its record; a split
--   partition with no piece outstanding, by the record of its whole span.
-- * Any other is a duplicate (its bit was set), or not held: corrupt, or lost.
-- Every argument is checked before the first write (the BITFIELD, or the SET that grows
-- a large index first). Every command runs once per call, not once per completion: a
-- batch of 30 costs little more than a batch of one.
local PART, CORRUPT, CORRUPT_RUN = 2, -2, -3
local format = string.format

-- Single completions (i = 1..n): pid, token, bit (strings), record, reply slot.
local pids, tokens, sbits, srecs, slot = {}, {}, {}, {}, {}
local n = 0
-- Groups (g = 1..ng): first pid and first bit (numbers), count, records, reply slot of
-- the first.
local gfirst, gtoken, gbit, gcount, grecs, gslot = {}, {}, {}, {}, {}, {}
local ng = 0
-- The runs the call's tokens name: decoded, by token (`runs`), or not (`broken`); those
-- that lose pids in this call (`touched`), and whether any did (`left`).
local runs, broken, touched, left = {}, {}, {}, false
-- The groups held whole, by group number.
local bulk, nb = {}, 0
-- Per single: its position in the run that holds it (`in_run`), else its record
-- (`recs`); its split entry (`ents`, false when the shard has none: the tables that
-- serve split partitions are not built either, as every table a call makes costs about
-- as much as a check).
local in_run, recs, ents = {}, {}, false
-- The BITFIELD operations (`ops`, `no` values), per single whether its lease is held
-- ('c', 'r' or nil) and the error of a record that does not decode (`bad`); the
-- highest bit set (`top`), and whether any lease is held to its end (`holding`).
local ops, no, held, bad, top, holding = {}, 0, {}, {}, -1, false
-- With split entries: the owner parts' decoded records, the whole-span records.
local partrec, finals
-- The BITFIELD's reply: one value per single, then one per field of the bulk groups.
local bits
-- The reply, and what the writes take: the pids whose record goes (`done`), the inbox
-- lines (`records`), owner parts (`parts`: pid, record) and split entries to write or
-- delete (`split_done`: pid, entry or nil).
local out, done, records, nd, nrec = {}, {}, {}, 0, 0
local parts, np, split_done, ns = nil, 0, nil, 0
-- Completions by the status they leave (claimed, running), counted once at the end.
local from_c, from_r = 0, 0

-- The arguments, checked: singles and groups, each with its reply slots.
local function read_args()
  entries(0, 4, true)
  local nslots = 0
  for e = 1, #ARGV / 4 do
    local pid, token, bit, rec = ARGV[4 * e - 3], ARGV[4 * e - 2], ARGV[4 * e - 1], ARGV[4 * e]
    -- The common case in one match: three nonzero IDs of at most 19 digits. Anything
    -- else (a zero, 20 digits, or a bad one) goes through `id` one by one, which names it.
    if not (#pid < 20 and #token < 20 and #bit < 20
        and string.find(pid .. ' ' .. token .. ' ' .. bit, '^[1-9]%d* [1-9]%d* [1-9]%d*$')) then
      id(pid, 'pid')
      id(token, 'token')
      id(bit, 'bit offset')
    end
    if rec == '' then refuse('completed record', rec) end
    -- The inbox entry holds one record per line.
    if not string.find(rec, '\n', 1, true) then
      n, nslots = n + 1, nslots + 1
      pids[n], tokens[n], sbits[n], srecs[n], slot[n] = pid, token, bit, rec, nslots
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
end

-- Runs first: a completion's token names its run, if the pid is in one. Each run is
-- read and decoded once. A run that does not decode (`broken`) holds none as far as
-- this call can tell: its pids are read from the active hash, a group of them taken
-- apart, and the run is never written (only a decoded run is `touched`). A pid with a
-- record of its own left its run for good and is completed by its record; one without
-- answers CORRUPT_RUN (or DUPLICATE when its bit is set, as a corrupt record does: it
-- completed before).
local function read_runs()
  local want, nwant, seen = {}, 0, {}
  for i = 1, n do
    if not seen[tokens[i]] then nwant, seen[tokens[i]] = nwant + 1, true; want[nwant] = tokens[i] end
  end
  for g = 1, ng do
    if not seen[gtoken[g]] then nwant, seen[gtoken[g]] = nwant + 1, true; want[nwant] = gtoken[g] end
  end
  local raw = redis.call('HMGET', KEYS[7], unpack(want))
  for j = 1, nwant do
    if raw[j] then
      local u = run_decode_or(KEYS[7], want[j], raw[j])
      if u then runs[want[j]] = u else broken[want[j]] = true end
    end
  end
end

-- Group `g`, held whole by its run, leaves it here (in the decoded run; written after
-- the checks) and goes to `bulk`; any other becomes single completions.
local function take_group(g)
  local u, k = runs[gtoken[g]], gcount[g]
  local at = u and gfirst[g] - u[7] + 1
  if at and at >= 1 and at + k - 1 <= #u[5]
      and string.sub(u[5], at, at + k - 1) == string.sub(FULL_MASK, 1, k) then
    u[5] = string.sub(u[5], 1, at - 1) .. string.sub(EMPTY_MASK, 1, k) .. string.sub(u[5], at + k)
    touched[gtoken[g]], left = u, true
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

-- The records of the singles no run holds, and the split entries, read only when the
-- shard has any.
local function read_records()
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
  if n > 0 and redis.call('HLEN', KEYS[6]) > 0 then
    ents, partrec, finals, parts, split_done = {}, {}, {}, {}, {}
    local raw = redis.call('HMGET', KEYS[6], unpack(pids))
    for i = 1, n do
      if raw[i] then ents[i] = split_decode(KEYS[6], pids[i], raw[i]) end
    end
  end
end

-- Single `i`'s BITFIELD operation: a held lease sets its bit (and reads the old one);
-- the others only read theirs, to tell a duplicate from a lost lease. A record not held
-- is checked (off the hot path): a corrupt one is reported CORRUPT, not lost.
local function plan_single(i)
  local bit = sbits[i]
  -- A pid its run holds is claimed, never split (a split carves it out first).
  if in_run[i] then
    held[i] = 'c'
    if ents then ents[i] = nil end
  else
    held[i] = holds(recs[i], tokens[i])
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
    -- The highest bit matters only for offsets of six digits or more: below 524,280
    -- the bitmap is under 64 KB, and Redis grows it (`grow_bitmap`).
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

-- A bulk group's bits, set up to 32 at a time (exact as Lua numbers), each field's old
-- value read back (set bits: completed before).
local function plan_group(g)
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

-- Case 1: group `g`, held whole, already out of its run whatever its bits say (`at`:
-- the last BITFIELD value read before its fields; returns its last). Its records go
-- to the inbox as sent when every bit was clear, else line by line.
local function finish_group(g, at)
  local k, first, rec = gcount[g], gslot[g], grecs[g]
  local clear, j = true, 0
  while j < k do
    at = at + 1
    if bits[at] ~= 0 then clear = false end
    j = j + math.min(32, k - j)
  end
  if clear then
    nrec = nrec + 1
    records[nrec] = rec
    for j = 0, k - 1 do out[first + j] = OK end
  else
    -- Some completed before (a retry, a restore): bit j of a field of w bits is its
    -- (w - j)th lowest.
    local from, f, w, v, base = 1, at - math.ceil(k / 32), 0, 0, 0
    for j = 0, k - 1 do
      if j == base + w then
        f, base, w = f + 1, j, math.min(32, k - j)
        v = bits[f]
      end
      local to = string.find(rec, '\n', from, true)
      if math.floor(v / 2 ^ (w - 1 - (j - base))) % 2 == 1 then
        out[first + j] = DUPLICATE
      else
        nrec = nrec + 1
        records[nrec] = string.sub(rec, from, (to or 0) - 1)
        out[first + j] = OK
      end
      from = (to or 0) + 1
    end
  end
  from_c = from_c + k
  return at
end

-- Case 2: the owner part of split partition `e` done, pieces outstanding: the record
-- stays running with no lease (no token to present).
local function finish_part(i, e)
  local r = partrec[i]
  r[3], r[4] = '', ''
  e[7] = '1'
  unrequest(e)
  parts[np + 1], parts[np + 2], np = pids[i], encode(r), np + 2
  split_done[ns + 1], split_done[ns + 2], ns = pids[i], split_encode(e), ns + 2
  out[slot[i]] = PART
end

-- Case 3: a pid its run holds leaves the run whatever its bit says (a set bit:
-- completed before, a restore). (A pid named twice in one call leaves, and is counted,
-- once.)
local function finish_in_run(i)
  local u = runs[tokens[i]]
  if string.byte(u[5], in_run[i]) == 99 then
    run_leave(u, in_run[i])
    touched[tokens[i]], left = u, true
    from_c = from_c + 1
  end
  if bits[i] == 1 then
    out[slot[i]] = DUPLICATE
  else
    nrec = nrec + 1
    records[nrec] = srecs[i]
    out[slot[i]] = OK
  end
end

-- Case 4: a lease its own record holds, completed: the record goes, and with a split
-- entry `e` (every piece done) the line of the partition's whole span.
local function finish_held(i, e)
  nd, nrec = nd + 1, nrec + 1
  done[nd], records[nrec] = pids[i], srecs[i]
  if e then
    records[nrec] = finals[i]
    split_done[ns + 1], split_done[ns + 2], ns = pids[i], nil, ns + 2
  end
  if held[i] == 'c' then from_c = from_c + 1 else from_r = from_r + 1 end
  out[slot[i]] = OK
end

-- Case 5: nothing to finish. Idempotency: the index bit is set exactly once per pid, so
-- a retried or late completion changes nothing and reaches the inbox (and the
-- statistics) only once. Otherwise the lease is not held: its record is corrupt, its
-- run is, or it was lost.
local function finish_not_held(i)
  if bits[i] == 1 then
    out[slot[i]] = DUPLICATE
  elseif bad[i] then
    out[slot[i]] = CORRUPT
  elseif not recs[i] and broken[tokens[i]] then
    out[slot[i]] = CORRUPT_RUN
  else
    out[slot[i]] = LOST
  end
end

-- The writes, each command once.
local function write()
  if from_c > 0 then moved('c', nil, from_c) end
  if from_r > 0 then moved('r', nil, from_r) end
  if nrec > 0 then
    -- Remove from the hot set, mark done (the BITFIELD) and hand the records to the
    -- archiver, in one atomic step: the inbox stream is durable, so nothing is lost
    -- between layers. One stream entry carries the whole batch, one record per line.
    if nd > 0 then
      variadic('HDEL', KEYS[1], done)
      variadic('ZREM', KEYS[2], done)
    end
    redis.call('XADD', KEYS[4], '*', 'r', table.concat(records, '\n'))
  end
  if from_c > 0 or from_r > 0 then count(KEYS[5]) end
  if left then variadic('ZREM', KEYS[2], runs_store(KEYS[7], touched)) end
  if np > 0 then
    variadic('HSET', KEYS[1], parts)
    local gone = {}
    for i = 1, np, 2 do gone[(i + 1) / 2] = parts[i] end
    variadic('ZREM', KEYS[2], gone)
  end
  for i = 1, ns, 2 do
    if split_done[i + 1] then
      redis.call('HSET', KEYS[6], split_done[i], split_done[i + 1])
    else
      redis.call('HDEL', KEYS[6], split_done[i])
    end
  end
end

read_args()
read_runs()
for g = 1, ng do take_group(g) end
read_records()
for i = 1, n do plan_single(i) end
for b = 1, nb do plan_group(bulk[b]) end
-- The counters of the statuses a completion moves (claimed and running), read and
-- checked only when a lease is held to its end: otherwise no status moves.
if holding then read_counts(KEYS[5], {'c', 'r'}) end
-- Every check done: the index grown to hold the highest bit, then every bit at once.
grow_bitmap(KEYS[3], top)
bits = redis.call('BITFIELD', KEYS[3], unpack(ops))

local at = n
for b = 1, nb do at = finish_group(bulk[b], at) end
for i = 1, n do
  local e = ents and ents[i]
  if held[i] and e and e[6] ~= '0' and bits[i] ~= 1 then
    finish_part(i, e)
  elseif in_run[i] then
    finish_in_run(i)
  elseif held[i] and bits[i] ~= 1 then
    finish_held(i, e)
  else
    finish_not_held(i)
  end
end
write()
return out
