-- seal: replace a compressed batch's open hash with its sealed binary v2 string.
-- KEYS[1] open batch hash   KEYS[2] sealed batch string   KEYS[3] set of open batch ids
--      KEYS[4] archive counters hash
-- ARGV[1] the open hash's length when the caller read it
-- ARGV[2] the sealed string the caller read and merged ('' if there was none)
-- ARGV[3] the new sealed string   ARGV[4] time to live in ms (0: none)   ARGV[5] batch id
-- ARGV[6] records in the new sealed string   ARGV[7] pids the batch can hold
-- Reply: 1 when sealed, 0 when the batch changed since it was read (nothing written;
-- the caller reads again). Records arrive in any order, so a record may land in the
-- open hash between the read and this call: the length check keeps it from being lost.
-- Every argument and key type is checked before the first write.
for _, i in ipairs({1, 4, 5, 6, 7}) do
  if not is_count(ARGV[i]) then
    error('seal: ARGV[' .. i .. '] `' .. tostring(ARGV[i]) .. '` is not a count; nothing was written')
  end
end
if not ARGV[2] or not ARGV[3] or ARGV[3] == '' then
  error('seal: no sealed string; nothing was written')
end
expect_type(KEYS[1], 'hash')
expect_type(KEYS[2], 'string')
expect_type(KEYS[3], 'set')
expect_type(KEYS[4], 'hash')
if redis.call('HLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return 0 end
local old = redis.call('GET', KEYS[2]) or ''
if old ~= ARGV[2] then return 0 end
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', KEYS[2], ARGV[3])
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[5])
-- A partial seal remembers its size, so later records can tell when the batch is full.
if tonumber(ARGV[6]) < tonumber(ARGV[7]) then
  redis.call('HSET', KEYS[4], 'partial:' .. ARGV[5], ARGV[6])
else
  redis.call('HDEL', KEYS[4], 'partial:' .. ARGV[5])
end
return 1
