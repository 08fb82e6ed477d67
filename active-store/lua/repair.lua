-- repair: set aside one active record that does not decode and rebuild the partition
-- (`tranche check --repair`). The raw value moves to the shard's quarantine hash (field
-- `<pid>@<now>`); the pid gets a fresh pending record of its plan's range (checkpoint at
-- its min id, no attempt spent, the error saying it was rebuilt), ready now in the
-- pending zset and out of the lease index. A pid whose completed-index bit is set was
-- completed: its corrupt record is only removed. The shard's counters are derived from
-- its records again (the corrupt record's status is unknown), skipping any other record
-- that does not decode.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] leases zset
--      KEYS[4] completed index   KEYS[5] status counters hash   KEYS[6] quarantine hash
-- ARGV[1] pid   ARGV[2] now ms   ARGV[3] the pid's bit offset   ARGV[4] min id
--      ARGV[5] max id
-- Reply: 1 rebuilt pending, 2 removed (completed), 0 nothing to repair (no record, or
-- one that decodes).
-- Every argument and the counters are checked before the first write.
if #ARGV ~= 5 then refuse('argument count', #ARGV) end
local pid, now = id(ARGV[1], 'pid'), ARGV[2]
num(now, 'now')
local offset, min, max = id(ARGV[3], 'bit offset'), id(ARGV[4], 'min id'), id(ARGV[5], 'max id')
if id_lt(max, min) then refuse('max id below min id', max) end
read_counts(KEYS[5])
local s = redis.call('HGET', KEYS[1], pid)
if not s or pcall(checked, KEYS[1], pid, s) then return 0 end
local done = redis.call('GETBIT', KEYS[4], offset) == 1
-- A key of the wrong type is refused before the first write: the counters, the active
-- hash and the index were read above, the quarantine is written first (its own refusal
-- writes nothing), and the lease index and the pending set, which nothing reads, are
-- checked.
expect_type(KEYS[3], 'zset')
expect_type(KEYS[2], 'zset')
redis.call('HSET', KEYS[6], pid .. '@' .. now, s)
redis.call('ZREM', KEYS[3], pid)
local reply
if done then
  redis.call('HDEL', KEYS[1], pid)
  redis.call('ZREM', KEYS[2], pid)
  reply = 2
else
  redis.call('HSET', KEYS[1], pid, encode({'p', '0', '', '', now, '', now, '', min, max, min,
    'rebuilt from a corrupt record (set aside in ' .. KEYS[6] .. ')'}))
  redis.call('ZADD', KEYS[2], now, pid)
  reply = 1
end
local n = {p = 0, c = 0, r = 0, f = 0, d = 0}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local rec = all[i + 1]
  local status = string.sub(rec, 1, 1)
  if n[status] and string.sub(rec, 2, 2) == '|' then n[status] = n[status] + 1 end
end
redis.call('HSET', KEYS[5], 'p', n.p, 'c', n.c, 'r', n.r, 'f', n.f, 'd', n.d, 'v', 1)
return reply
