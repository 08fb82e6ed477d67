-- complete: finish any number of leases of one shard in one round trip (group commit).
-- KEYS[1] active hash   KEYS[2] leases zset   KEYS[3] completed-index bitmap
--      KEYS[4] inbox stream   KEYS[5] status counters hash
-- ARGV per completion: pid, token, bit offset in the index, encoded completed record
-- Reply: per completion, OK, DUPLICATE or LOST.
-- Every argument is checked before the first write (the BITFIELD). Every command
-- runs once per call, not once per completion: a batch of 30 costs little more than a
-- batch of one.
entries(0, 4, true)
local n = #ARGV / 4
local pids = {}
for i = 1, n do
  pids[i] = id(ARGV[4 * i - 3], 'pid')
  id(ARGV[4 * i - 2], 'token')
  id(ARGV[4 * i - 1], 'bit offset')
  -- The inbox entry holds one record per line.
  local rec = ARGV[4 * i]
  if rec == '' or string.find(rec, '\n', 1, true) then refuse('completed record', rec) end
end
local recs = redis.call('HMGET', KEYS[1], unpack(pids))
read_counts(KEYS[5])

-- One BITFIELD for the whole batch: held leases set their bit (and read the old one);
-- the others only read theirs, to tell a duplicate from a lost lease. A record not held
-- is checked (off the hot path): a corrupt one is refused, not reported lost.
local ops, held, no = {}, {}, 0
for i = 1, n do
  local bit = ARGV[4 * i - 1]
  held[i] = holds(recs[i], ARGV[4 * i - 2])
  if held[i] then
    ops[no + 1], ops[no + 2], ops[no + 3], ops[no + 4] = 'SET', 'u1', bit, 1
    no = no + 4
  else
    if recs[i] then checked(KEYS[1], pids[i], recs[i]) end
    ops[no + 1], ops[no + 2], ops[no + 3] = 'GET', 'u1', bit
    no = no + 3
  end
end
local bits = redis.call('BITFIELD', KEYS[3], unpack(ops))

local out, done, records, nd = {}, {}, {}, 0
for i = 1, n do
  if bits[i] == 1 then
    -- Idempotency: the index bit is set exactly once per pid, so a retried or late
    -- completion changes nothing and reaches the inbox (and the statistics) only once.
    out[i] = DUPLICATE
  elseif held[i] then
    nd = nd + 1
    done[nd], records[nd] = pids[i], ARGV[4 * i]
    moved(held[i], nil)
    out[i] = OK
  else
    out[i] = LOST
  end
end

if nd > 0 then
  -- Remove from the hot set, mark done (above) and hand the records to the archiver,
  -- in one atomic step: the inbox stream is durable, so nothing is lost between layers.
  -- One stream entry carries the whole batch, one record per line.
  variadic('HDEL', KEYS[1], done)
  variadic('ZREM', KEYS[2], done)
  redis.call('XADD', KEYS[4], '*', 'r', table.concat(records, '\n'))
  count(KEYS[5])
end
return out
