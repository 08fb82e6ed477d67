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
-- ARGV[a + 3s + 2 ..] the statistics delta of exactly these records (apply_stats' args),
--      then optionally the statistics' ranges layout: 1 (compact bodies, read by every
--      version), or 2 (packed bodies, the namespace's archive format 3 allowing it)
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

-- Every bit this call sets, as fields of at most 32 consecutive offsets (exact as Lua
-- numbers; bit offsets stay below BITMAP_BITS, so their arithmetic is exact too), each
-- {first offset, width, records before its first}: first the one-by-one records' runs of
-- consecutive offsets in the order sent, then each sealed batch's bits. A BITFIELD
-- operation costs about as much whatever its width (some 1.5 us), and a shard's inbox
-- is mostly runs of consecutive pids. An offset is canonical decimal, as BITFIELD
-- would insist.
local fields, total = {}, 0
local i = 1
while i <= n do
  local bit = ARGV[4 * i - 1]
  local off = tonumber(bit)
  if not off or off < 0 or off >= BITMAP_BITS or string.format('%d', off) ~= bit then
    return redis.error_reply('ERR archive: record ' .. i .. ' has bit offset `' .. tostring(bit) .. '`')
  end
  local k = 1
  while k < 32 and i + k <= n and ARGV[4 * (i + k) - 1] == string.format('%d', off + k) do
    k = k + 1
  end
  fields[#fields + 1] = {off, k, i - 1}
  i = i + k
end
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

-- Everything is checked before the first write: each record's target, the time to
-- live, and the statistics delta, whose writes `stats_plan` computes without issuing
-- them (a delta that could overflow a counter is refused here, so a refused batch
-- finds nothing written).
-- The targets are checked as each record's pid and payload are listed for its tier (a
-- list is no write): the simple hash's pairs, and each open batch hash's by its KEYS
-- index. Lists are filled through counters (`#t` is a search in Lua 5.1), and the common
-- target, `0`, is known without converting it.
local simple, nsimple, open = {}, 0, {}
for i = 1, n do
  local t = ARGV[4 * i + 1]
  local target = t == '0' and 0 or tonumber(t)
  if not target or target < 0 or target > m or target % 1 ~= 0 then
    return redis.error_reply('ERR archive: record ' .. i .. ' has target `' .. tostring(t) .. '`')
  end
  if target == 0 then
    simple[nsimple + 1], simple[nsimple + 2], nsimple = ARGV[4 * i - 2], ARGV[4 * i], nsimple + 2
  else
    local list = open[9 + target]
    if not list then
      list = {}
      open[9 + target] = list
    end
    list[#list + 1] = ARGV[4 * i - 2]
    list[#list + 1] = ARGV[4 * i]
  end
end
if not tonumber(ttl) then
  return redis.error_reply('ERR archive: time to live `' .. tostring(ttl) .. '`')
end
local delta_at = a + 3 * s + 2
if not is_count(ARGV[delta_at]) then
  return redis.error_reply('ERR archive: statistics delta of `' .. tostring(ARGV[delta_at]) .. '` arguments')
end
local layout_at = delta_at + tonumber(ARGV[delta_at]) + 1
local layout = ARGV[layout_at]
if #ARGV > layout_at or (layout ~= nil and layout ~= '1' and layout ~= '2') then
  return redis.error_reply('ERR archive: statistics ranges layout `' .. tostring(layout) .. '`')
end
local stats_writes = stats_plan(4, delta_at, nil, layout == '2')
-- The keys this call writes must be of their type, and the counters it adds to or
-- reads back integers: a command failing after the first write would leave it half
-- done.
expect_type(KEYS[1], 'string')
expect_type(KEYS[2], 'hash')
expect_type(KEYS[3], 'hash')
expect_type(KEYS[9], 'set')
for j = 1, m do expect_type(KEYS[9 + j], 'hash') end
for j = 1, s do expect_type(KEYS[9 + m + j], 'string') end
-- The count and every open batch's partial count, in one read.
local count_fields = {'count'}
for j = 1, m do count_fields[j + 1] = 'partial:' .. ARGV[2 + 4 * n + j] end
local count_values = redis.call('HMGET', KEYS[3], unpack(count_fields))
for j = 1, m + 1 do
  local v = count_values[j]
  if v and not is_count(v) then
    error('archive: ' .. KEYS[3] .. ' ' .. count_fields[j] .. ' `' .. v .. '` is not a count; nothing was written')
  end
end

-- One BITFIELD sets every record's archived bit and returns the old ones: reading and
-- setting them in two calls cost the archive about a seventh of its time. A record
-- whose old bit is set, or one bit twice in this call, is a duplicate; the call then
-- puts back the bits it changed (`undo`), so a refused call leaves every bit as it
-- found it (an existing bitmap may be longer, with zeros).
-- (4 values per record: MAX_SCRIPT_RECORDS keeps them under Lua's 8000 for unpack.)
local ops, no = {}, 0
-- The bitmap is grown first to hold the highest bit (`grow_bitmap`, common.lua), as the
-- completed index is.
local top = -1
for _, f in ipairs(fields) do top = math.max(top, f[1] + f[2] - 1) end
grow_bitmap(KEYS[1], top)
for _, f in ipairs(fields) do
  ops[no + 1], ops[no + 2], ops[no + 3], ops[no + 4] = 'SET', 'u' .. f[2], f[1], 2 ^ f[2] - 1
  no = no + 4
end
local bits = redis.call('BITFIELD', KEYS[1], unpack(ops))

-- Puts back the bits the BITFIELD above changed, undoing its operations last to first
-- (so one bit set twice ends as it was): a refused call leaves every bit as it found it.
-- A bitmap left all zeros (it did not exist before) is deleted.
local function undo()
  local back, nb = {}, 0
  for c = #fields, 1, -1 do
    local f = fields[c]
    back[nb + 1], back[nb + 2], back[nb + 3], back[nb + 4] = 'SET', 'u' .. f[2], f[1], bits[c]
    nb = nb + 4
  end
  if nb > 0 then redis.call('BITFIELD', KEYS[1], unpack(back)) end
  if redis.call('BITCOUNT', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
end

-- Idempotency: a record whose bit was set was stored and counted before (a retried
-- completion, or a batch an archiver wrote but died before acknowledging). Refuse the
-- whole call rather than write part of it, so the statistics stay exact.
local dups = {0}
for c, f in ipairs(fields) do
  local v = bits[c]
  if v ~= 0 then
    -- The field's first bit is its most significant.
    for b = 0, f[2] - 1 do
      if math.floor(v / 2 ^ (f[2] - 1 - b)) % 2 == 1 then dups[#dups + 1] = f[3] + b + 1 end
    end
  end
end
if #dups > 1 then
  undo()
  return dups
end

-- All fresh: the statistics count exactly what the rest of this call writes, in the
-- same atomic step. Then the tiers and the count.
stats_write(stats_writes)
if nsimple > 0 then variadic('HSET', KEYS[2], simple) end
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
