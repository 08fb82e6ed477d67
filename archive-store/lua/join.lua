-- join: gather a segment's sealed batches into one segment string (see segment.rs for
-- the layout) once every planned batch of it is sealed whole, and delete their keys.
-- KEYS[1] archive counters hash   KEYS[2] segment string
--      KEYS[3 .. 2 + g] the segment's batch strings, in slot order
-- ARGV[1] g, the batches per segment   ARGV[1 + j] the batch id of slot j (1..g)
-- ARGV[1 + g + j] 1 when slot j's batch can hold planned pids (it must be sealed whole
--      before the segment is joined), 0 when it cannot (below the first pid)
-- ARGV[2 + 2g] the segment layout to write: 1 (whole batches), or 2 (headless batches,
--      the namespace's archive format allowing it)   ARGV[3 + 2g] the batch size
-- Layout 2 drops from each batch the header fields the segment implies (segment.rs);
-- a batch whose header does not strip cleanly makes the segment layout 1, so every
-- byte of every batch is kept either way.
-- Reply: 1 when joined, 0 when not (a planned batch not sealed yet, or only partially,
-- or the segment joined already). Joining twice, or racing a seal, is harmless: the
-- segment is written once, from batch keys that are all there.
-- Every argument and key type is checked before the first write (the batch keys are
-- read whole below, before it).
if not is_count(ARGV[1]) or tonumber(ARGV[1]) < 1 then
  error('join: batch count `' .. tostring(ARGV[1]) .. '`; nothing was written')
end
local g = tonumber(ARGV[1])
if #ARGV ~= 3 + 2 * g or #KEYS ~= 2 + g then
  error('join: ' .. g .. ' batches, ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not match; nothing was written')
end
for j = 1, g do
  if not is_count(ARGV[1 + j]) or (ARGV[1 + g + j] ~= '0' and ARGV[1 + g + j] ~= '1') then
    error('join: slot ' .. j .. ' `' .. ARGV[1 + j] .. '` `' .. ARGV[1 + g + j] .. '`; nothing was written')
  end
end
local layout, size = ARGV[2 + 2 * g], ARGV[3 + 2 * g]
if (layout ~= '1' and layout ~= '2') or not is_count(size) or tonumber(size) < 1 then
  error('join: layout `' .. tostring(layout) .. '` batch size `' .. tostring(size) .. '`; nothing was written')
end
expect_type(KEYS[1], 'hash')
expect_type(KEYS[2], 'string')
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local blobs, ttl, forever = {}, -1, false
for j = 1, g do
  local blob = redis.call('GET', KEYS[2 + j])
  if blob then
    -- A partial seal waits for the rest of its batch: not joined yet.
    if redis.call('HEXISTS', KEYS[1], 'partial:' .. ARGV[1 + j]) == 1 then return 0 end
    local left = redis.call('PTTL', KEYS[2 + j])
    if left < 0 then forever = true elseif left > ttl then ttl = left end
    blobs[j] = blob
  elseif ARGV[1 + g + j] == '1' then
    return 0
  else
    blobs[j] = ''
  end
end

local function varint(n)
  local out = {}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  return table.concat(out)
end
-- A canonical varint at byte i of s below 2^49 (exact as a Lua number): its value and
-- the index after it, or nil.
local function varint_at(s, i)
  local v, mul = 0, 1
  for k = 0, 6 do
    local b = string.byte(s, i + k)
    if not b then return nil end
    if b < 128 then
      if b == 0 and k > 0 then return nil end
      return v + b * mul, i + k + 1
    end
    v = v + (b - 128) * mul
    mul = mul * 128
  end
  return nil
end

-- Batch `id`'s binary v2 bytes without magic, version, batch id, batch size and
-- payload length (codec's strip_binary_v2_header), or nil unless every one of them is
-- what the segment implies and the rest is laid out as binary v2.
local function headless(blob, id, bsize)
  if string.sub(blob, 1, 5) ~= 'TRCB\2' then return nil end
  local flags = string.byte(blob, 6)
  if not flags then return nil end
  local found, i = varint_at(blob, 7)
  if found == nil or found ~= id then return nil end
  local fsize, j = varint_at(blob, i)
  if fsize == nil or fsize ~= bsize then return nil end
  local _, k = varint_at(blob, j)
  if k == nil then return nil end
  if flags % 2 == 1 then
    _, k = varint_at(blob, k)
    if k == nil then return nil end
  end
  local plen, p = varint_at(blob, k)
  if plen == nil or #blob - p + 1 ~= plen + 4 then return nil end
  return string.char(flags) .. string.sub(blob, j, k - 1) .. string.sub(blob, p)
end

local parts
if layout == '2' then
  parts = {string.char(2), varint(g), varint(tonumber(size))}
  local stripped = {}
  for j = 1, g do
    if #blobs[j] > 0 then
      -- Batch ids past 15 digits are not exact as Lua numbers: layout 1 for them.
      local id = #ARGV[1 + j] <= 15 and tonumber(ARGV[1 + j]) or nil
      stripped[j] = id and headless(blobs[j], id, tonumber(size))
      if not stripped[j] then parts = nil break end
    else
      stripped[j] = ''
    end
  end
  if parts then
    -- Lengths as their difference from the shortest blob's, plus 1 (0: no blob).
    local base
    for j = 1, g do
      if #stripped[j] > 0 and (not base or #stripped[j] < base) then base = #stripped[j] end
    end
    base = base or 0
    parts[#parts + 1] = varint(base)
    for j = 1, g do
      parts[#parts + 1] = varint(#stripped[j] > 0 and #stripped[j] - base + 1 or 0)
    end
    for j = 1, g do parts[#parts + 1] = stripped[j] end
  end
end
if not parts then
  parts = {string.char(1), varint(g)}
  for j = 1, g do parts[#parts + 1] = varint(#blobs[j]) end
  for j = 1, g do parts[#parts + 1] = blobs[j] end
end
-- A segment expires when the last of its batches would have; if any of them had no
-- expiry (sealed under the compressed tier), none does, so nothing expires early.
if forever or ttl < 0 then
  redis.call('SET', KEYS[2], table.concat(parts))
else
  redis.call('SET', KEYS[2], table.concat(parts), 'PX', ttl)
end
for j = 1, g do
  if #blobs[j] > 0 then redis.call('DEL', KEYS[2 + j]) end
end
return 1
