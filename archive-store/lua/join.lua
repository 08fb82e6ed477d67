-- join: gather a segment's sealed batches into one segment string (see segment.rs for
-- the layout) once every planned batch of it is sealed whole, and delete their keys.
-- KEYS[1] archive counters hash   KEYS[2] segment string
--      KEYS[3 .. 2 + g] the segment's batch strings, in slot order
-- ARGV[1] g, the batches per segment   ARGV[1 + j] the batch id of slot j (1..g)
-- ARGV[1 + g + j] 1 when slot j's batch can hold planned pids (it must be sealed whole
--      before the segment is joined), 0 when it cannot (below the first pid)
-- Reply: 1 when joined, 0 when not (a planned batch not sealed yet, or only partially,
-- or the segment joined already). Joining twice, or racing a seal, is harmless: the
-- segment is written once, from batch keys that are all there.
-- Every argument and key type is checked before the first write (the batch keys are
-- read whole below, before it).
if not is_count(ARGV[1]) or tonumber(ARGV[1]) < 1 then
  error('join: batch count `' .. tostring(ARGV[1]) .. '`; nothing was written')
end
local g = tonumber(ARGV[1])
if #ARGV ~= 1 + 2 * g or #KEYS ~= 2 + g then
  error('join: ' .. g .. ' batches, ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not match; nothing was written')
end
for j = 1, g do
  if not is_count(ARGV[1 + j]) or (ARGV[1 + g + j] ~= '0' and ARGV[1 + g + j] ~= '1') then
    error('join: slot ' .. j .. ' `' .. ARGV[1 + j] .. '` `' .. ARGV[1 + g + j] .. '`; nothing was written')
  end
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
local parts = {string.char(1), varint(g)}
for j = 1, g do parts[#parts + 1] = varint(#blobs[j]) end
for j = 1, g do parts[#parts + 1] = blobs[j] end
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
