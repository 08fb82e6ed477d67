-- format: raise a namespace's archive format version (see ArchiveFormat), never lower it.
-- KEYS[1] {ns}:meta
-- ARGV[1] the format version wanted (a count, at least 1)
-- Reply: the version recorded after the call (a namespace without one is at 1).
-- Readers of every version read every format it could hold before; a writer writes
-- what the recorded version allows, so raising it is the only switch, and lowering it
-- (a downgraded tool) could only stop writers from using what readers already read.
-- The argument and the recorded value are checked before the one write.
if #ARGV ~= 1 or not is_count(ARGV[1]) or tonumber(ARGV[1]) < 1 then
  error('format: version `' .. tostring(ARGV[1]) .. '`; nothing was written')
end
expect_type(KEYS[1], 'hash')
local recorded = redis.call('HGET', KEYS[1], 'archive_format')
if recorded and (not is_count(recorded) or tonumber(recorded) < 1) then
  error('format: ' .. KEYS[1] .. ' archive_format `' .. recorded .. '` is not a version; nothing was written')
end
local have = tonumber(recorded or '1')
if tonumber(ARGV[1]) > have then
  redis.call('HSET', KEYS[1], 'archive_format', ARGV[1])
  return tonumber(ARGV[1])
end
return have
