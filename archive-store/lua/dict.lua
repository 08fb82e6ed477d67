-- dict: compare-and-set the namespace's worker dictionary, so that concurrent archivers
-- adding workers agree on every index (the dictionary only ever grows).
-- KEYS[1] {ns}:dict
-- ARGV[1] the dictionary bytes the caller read ('' if none)   ARGV[2] the new bytes
-- Reply: 1 when written; 0 when the dictionary changed since it was read (the caller
-- reads it again and re-adds its workers on top).
if not ARGV[1] or not ARGV[2] or ARGV[2] == '' or #ARGV ~= 2 then
  error('dict: takes the old and the new bytes, the new not empty; nothing was written')
end
expect_type(KEYS[1], 'string')
local old = redis.call('GET', KEYS[1]) or ''
if old ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
