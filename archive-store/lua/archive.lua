-- archive: write one batch of completed records of one shard, exactly once.
-- KEYS[1] archived bitmap   KEYS[2] simple-tier hash   KEYS[3] archive counters hash
--      KEYS[4..8] the shard's five statistics keys (tranche-stats' stats_keys order)
--      KEYS[9] set of open batch ids   KEYS[10 .. 9 + m] open batch hashes
--      KEYS[10 + m .. 9 + m + s] sealed batch strings written whole by this call
-- ARGV[1] n, the number of records sent one by one (those not in a sealed batch)
-- ARGV per such record (4 each, from ARGV[2]): pid, bit offset, payload, target
--      (0: the simple hash; k > 0: the open batch hash KEYS[9 + k])
-- ARGV[2 + 4n] the number m of open batches, then their m batch ids (KEYS[10..] order)
-- ARGV[a = 3 + 4n + m] the number s of sealed batches, then their s binary v2 strings,
--      then the time to live of sealed batches in ms (0: none), then per sealed batch
--      its records' first bit offset and their count (a sealed batch holds every
--      planned pid of its batch, so its bits are contiguous: no per-record arguments)
-- ARGV[a + 3s + 2 ..] the statistics delta of exactly these records (apply_stats' args)
-- Records are numbered 1.. in this order: the n one by one, then each sealed batch's
-- in bit order.
-- Reply: {1, written, size of batch 1, size of batch 2, ...} when every record was fresh
--        and all were written: a size counts the open hash and any earlier partial seal
--        (counter `partial:{id}`), so the caller knows which batches are full;
--        {0, i, j, ...} when records i, j, ... were archived already, in which case
--        nothing at all was written: the caller drops them and calls again, so the
--        statistics delta it sends always covers exactly the records written.
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[2 + 4 * n])
local a = 3 + 4 * n + m
local s = tonumber(ARGV[a])
local ttl = ARGV[a + s + 1]
if n == 0 and s == 0 then return {1, 0} end

-- The sealed batches' bits as fields of at most 32 bits (exact as Lua numbers; bit
-- offsets stay below 2^32, so their arithmetic is exact too).
local fields, total = {}, 0
for j = 1, s do
  local off = tonumber(ARGV[a + s + 2 * j])
  local left = tonumber(ARGV[a + s + 2 * j + 1])
  local at = n + total
  total = total + left
  while left > 0 do
    local k = math.min(32, left)
    fields[#fields + 1] = {off, k, at}
    off, left, at = off + k, left - k, at + k
  end
end

-- One BITFIELD reads every record's archived bit.
local ops = {}
for i = 1, n do
  local base = 4 * (i - 1) + 2
  ops[#ops + 1] = 'GET'
  ops[#ops + 1] = 'u1'
  ops[#ops + 1] = ARGV[base + 1]
end
for _, f in ipairs(fields) do
  ops[#ops + 1] = 'GET'
  ops[#ops + 1] = 'u' .. f[2]
  ops[#ops + 1] = f[1]
end
local bits = redis.call('BITFIELD', KEYS[1], unpack(ops))

-- Idempotency: a record whose bit is set was stored and counted before (a retried
-- completion, or a batch an archiver wrote but died before acknowledging). Refuse the
-- whole call rather than write part of it, so the statistics stay exact.
local dups = {0}
for i = 1, n do
  if bits[i] == 1 then dups[#dups + 1] = i end
end
for c, f in ipairs(fields) do
  local v = bits[n + c]
  if v ~= 0 then
    -- The field's first bit is its most significant.
    for b = 0, f[2] - 1 do
      if math.floor(v / 2 ^ (f[2] - 1 - b)) % 2 == 1 then dups[#dups + 1] = f[3] + b + 1 end
    end
  end
end
if #dups > 1 then return dups end

-- All fresh. The statistics first: apply_stats refuses, before writing anything, a
-- delta that could overflow a counter, and Redis does not undo a script's earlier
-- writes, so a refused batch must find nothing written yet. The statistics then count
-- exactly what the rest of this call writes, in the same atomic step.
apply_stats(4, a + 3 * s + 2)

-- Set the bits, write the tiers, count.
local sets, simple, open = {}, {}, {}
for i = 1, n do
  local base = 4 * (i - 1) + 2
  sets[#sets + 1] = 'SET'
  sets[#sets + 1] = 'u1'
  sets[#sets + 1] = ARGV[base + 1]
  sets[#sets + 1] = 1
  local target = tonumber(ARGV[base + 3])
  if target == 0 then
    simple[#simple + 1] = ARGV[base]
    simple[#simple + 1] = ARGV[base + 2]
  else
    local k = 9 + target
    open[k] = open[k] or {}
    local f = open[k]
    f[#f + 1] = ARGV[base]
    f[#f + 1] = ARGV[base + 2]
  end
end
for _, f in ipairs(fields) do
  sets[#sets + 1] = 'SET'
  sets[#sets + 1] = 'u' .. f[2]
  sets[#sets + 1] = f[1]
  sets[#sets + 1] = 2 ^ f[2] - 1
end
redis.call('BITFIELD', KEYS[1], unpack(sets))
if #simple > 0 then variadic('HSET', KEYS[2], simple) end
for k, list in pairs(open) do variadic('HSET', KEYS[k], list) end
redis.call('HINCRBY', KEYS[3], 'count', n + total)
if m > 0 then redis.call('SADD', KEYS[9], unpack(ARGV, 3 + 4 * n, 2 + 4 * n + m)) end
-- A batch whose every planned pid is in this call, all fresh, has nothing archived
-- elsewhere (no open hash, no partial seal): the caller sealed it already.
for j = 1, s do
  if tonumber(ttl) > 0 then
    redis.call('SET', KEYS[9 + m + j], ARGV[a + j], 'PX', ttl)
  else
    redis.call('SET', KEYS[9 + m + j], ARGV[a + j])
  end
end
local out = {1, n + total}
for j = 1, m do
  local partial = redis.call('HGET', KEYS[3], 'partial:' .. ARGV[2 + 4 * n + j]) or 0
  out[#out + 1] = redis.call('HLEN', KEYS[9 + j]) + tonumber(partial)
end
return out
