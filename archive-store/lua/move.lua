-- move: compaction's step from the simple tier into open batches of the current tier.
-- KEYS[1] simple-tier hash   KEYS[2] set of open batch ids
--      KEYS[3..] open batch hashes (as many as ARGV names)
-- ARGV[1] m, the number of open batches, then their m batch ids (KEYS[3..] order)
-- ARGV after those, per record (2 each): pid, k (its open batch is KEYS[2 + k])
-- Reply: the number of records moved. Archived bits and statistics do not change: the
-- record is the same, only where it lives. A pid already gone from the simple hash (a
-- concurrent compaction) is skipped, so running two compactions at once is harmless.
-- Every argument and key type is checked before the first write.
if not is_count(ARGV[1]) then
  error('move: batch count `' .. tostring(ARGV[1]) .. '` is not a count; nothing was written')
end
local m = tonumber(ARGV[1])
if #ARGV < 1 + m or (#ARGV - 1 - m) % 2 ~= 0 or #KEYS ~= 2 + m then
  error('move: ' .. m .. ' batches, ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not match; nothing was written')
end
for j = 2, 1 + m do
  if not is_count(ARGV[j]) then
    error('move: batch id `' .. ARGV[j] .. '` is not a count; nothing was written')
  end
end
for i = 2 + m, #ARGV, 2 do
  local k = tonumber(ARGV[i + 1])
  if not is_count(ARGV[i]) or not is_count(ARGV[i + 1]) or k < 1 or k > m then
    error('move: record `' .. ARGV[i] .. '` to batch `' .. ARGV[i + 1] .. '`; nothing was written')
  end
end
expect_type(KEYS[1], 'hash')
expect_type(KEYS[2], 'set')
for j = 3, 2 + m do expect_type(KEYS[j], 'hash') end
local moved = 0
for i = 2 + m, #ARGV, 2 do
  local pid = ARGV[i]
  local json = redis.call('HGET', KEYS[1], pid)
  if json then
    redis.call('HSET', KEYS[2 + tonumber(ARGV[i + 1])], pid, json)
    redis.call('HDEL', KEYS[1], pid)
    moved = moved + 1
  end
end
if m > 0 then redis.call('SADD', KEYS[2], unpack(ARGV, 2, 1 + m)) end
return moved
