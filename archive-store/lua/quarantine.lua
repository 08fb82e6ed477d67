-- quarantine: sets one damaged archived value aside, exactly as it is, and removes it.
-- KEYS[1] the damaged key: the simple-tier hash, an open batch hash or a sealed batch
--      string   KEYS[2] the shard's quarantine hash   KEYS[3] the shard's archive
--      counters hash   KEYS[4] the shard's set of open batch ids
-- ARGV[1] the hash field (a pid), or '' for a whole string   ARGV[2] the value as it
--      was read: anything else there now is left alone   ARGV[3] the quarantine field
--      (the pid, or batch:N)   ARGV[4] the archived records lost with it   ARGV[5] now
--      in ms   ARGV[6] the open batch's id when KEYS[1] is one, else ''
-- Reply: 1 set aside; 0 the value changed or went since it was read (nothing written).
-- The records stay counted: their statistics were applied when they were archived,
-- and their archived bits stay set, so nothing counts them again; `lost` in the
-- counters hash says how many records the archive can no longer show.
local field, seen, qfield, lost, now, open_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if type(seen) ~= 'string' or type(qfield) ~= 'string' or qfield == '' then
  error('quarantine: the value read and the quarantine field are required; nothing was written')
end
if not is_count(lost) or not is_count(now) then
  error('quarantine: lost `' .. tostring(lost) .. '` or now `' .. tostring(now) .. '` is not a count; nothing was written')
end
if open_id ~= '' and not is_count(open_id) then
  error('quarantine: open batch id `' .. tostring(open_id) .. '` is not a count; nothing was written')
end
if field == '' then expect_type(KEYS[1], 'string') else expect_type(KEYS[1], 'hash') end
expect_type(KEYS[2], 'hash')
expect_type(KEYS[3], 'hash')
expect_type(KEYS[4], 'set')
local had = redis.call('HGET', KEYS[3], 'lost')
if had and not is_count(had) then
  error('quarantine: ' .. KEYS[3] .. ' lost `' .. had .. '` is not a count; nothing was written')
end
local now_value
if field == '' then
  now_value = redis.call('GET', KEYS[1])
else
  now_value = redis.call('HGET', KEYS[1], field)
end
if now_value ~= seen then return 0 end
if redis.call('HEXISTS', KEYS[2], qfield) == 1 then qfield = qfield .. '@' .. now end
redis.call('HSET', KEYS[2], qfield, now_value)
if field == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('HDEL', KEYS[1], field)
  if open_id ~= '' and redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('SREM', KEYS[4], open_id)
  end
end
if lost ~= '0' then redis.call('HINCRBY', KEYS[3], 'lost', lost) end
return 1
