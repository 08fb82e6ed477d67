-- piece_complete: finish pieces of one shard (split.lua). The last part of a partition
-- to finish (its owner part done, no piece left) completes the partition as complete.lua
-- does: its record leaves the active set, its completed-index bit is set and its record
-- (its whole range, the owner as worker, from its first claim) goes to the inbox.
-- KEYS[1] active hash   KEYS[2] completed-index bitmap   KEYS[3] inbox stream
--      KEYS[4] status counters hash   KEYS[5] splits hash   KEYS[6] pieces hash
--      KEYS[7] piece_leases zset
-- ARGV[1] now ms, then per piece: `pid:start`, token, the partition's bit offset
-- Reply: per piece, 1 (done), 2 (done, and its partition completed) or -1 (lost).
entries(1, 3, true)
local now = num(ARGV[1], 'now')
local n = (#ARGV - 1) / 3
local keys, pids = {}, {}
for i = 1, n do
  keys[i] = ARGV[3 * i - 1]
  pids[i] = piece_key(keys[i], 'piece')
  id(ARGV[3 * i], 'token')
  -- Checked against the bitmap's end here: BITFIELD would refuse it after the first
  -- write.
  if not in_bitmap(id(ARGV[3 * i + 1], 'bit offset')) then refuse('bit offset', ARGV[3 * i + 1]) end
end
local recs = redis.call('HMGET', KEYS[6], unpack(keys))
local raw = redis.call('HMGET', KEYS[5], unpack(pids))
local parents = redis.call('HMGET', KEYS[1], unpack(pids))
read_counts(KEYS[4])
-- Everything is read and checked before the first write.
local ents, parent, gone, out = {}, {}, {}, {}
local done, nd, finished, nf = {}, 0, {}, 0
for i = 1, n do
  local key, pid = keys[i], pids[i]
  local r = not gone[key] and recs[i] and checked(KEYS[6], key, recs[i])
  if leased(r, ARGV[3 * i]) then
    if not raw[i] then corrupt(KEYS[5], pid, 'a piece without its split entry') end
    ents[pid] = ents[pid] or split_decode(KEYS[5], pid, raw[i])
    if parents[i] and not parent[pid] then parent[pid] = checked(KEYS[1], pid, parents[i]) end
    local e = ents[pid]
    if tonumber(e[6]) < 1 then corrupt(KEYS[5], pid, 'no piece outstanding') end
    e[6] = int(tonumber(e[6]) - 1)
    -- A request for this piece goes with it: left, it would hold the partition's
    -- other parts busy until it went stale.
    if e[1] == r[9] then unrequest(e) end
    gone[key] = true
    nd = nd + 1
    done[nd] = key
    out[i] = 1
    if e[6] == '0' and e[7] == '1' and parent[pid] then
      nf = nf + 1
      finished[nf] = {i, pid, ARGV[3 * i + 1]}
    end
  else
    out[i] = -1
  end
end
if nd == 0 then return out end
-- A key of the wrong type is refused before the first write: the active, splits and
-- pieces hashes and the counters were read above, the lease index is written first
-- (its own refusal writes nothing), and the index and the inbox, which nothing reads,
-- are checked when a partition completes.
if nf > 0 then
  expect_type(KEYS[2], 'string')
  expect_type(KEYS[3], 'stream')
end
variadic('ZREM', KEYS[7], done)
-- The index grows as complete.lua grows it (`grow_bitmap`, common.lua), to hold the
-- highest bit this call sets.
local top = -1
for j = 1, nf do top = math.max(top, tonumber(finished[j][3])) end
grow_bitmap(KEYS[2], top)
variadic('HDEL', KEYS[6], done)
local lines = {}
for j = 1, nf do
  local i, pid, bit = finished[j][1], finished[j][2], finished[j][3]
  local old = redis.call('BITFIELD', KEYS[2], 'SET', 'u1', bit, 1)[1]
  if old == 0 then
    lines[#lines + 1] = finished_record(ents[pid], now)
    moved(parent[pid][1], nil)
    redis.call('HDEL', KEYS[1], pid)
    out[i] = 2
  end
  redis.call('HDEL', KEYS[5], pid)
  ents[pid] = nil
end
for pid, e in pairs(ents) do redis.call('HSET', KEYS[5], pid, split_encode(e)) end
if #lines > 0 then
  redis.call('XADD', KEYS[3], '*', 'r', table.concat(lines, '\n'))
  count(KEYS[4])
end
return out
