-- discard: give up a failed or pending partition for good (an operator's decision).
-- Its record stays, marked discarded (status d), so the pid answers "discarded" for
-- ever: never claimed again, never archived, never mistaken for completed. Claimed and
-- running partitions are refused: release or reap them first, so no live lease is
-- pulled from under a worker.
-- KEYS[1] active hash   KEYS[2] pending zset   KEYS[3] status counters hash
-- ARGV[1] pid   ARGV[2] now ms
-- Reply: 1 discarded, 0 not pending or failed, -2 leased.
local pid, now = ARGV[1], ARGV[2]
local r = decode(redis.call('HGET', KEYS[1], pid) or '')
if r == nil or r[1] == 'd' then return 0 end
if r[1] == 'c' or r[1] == 'r' then return -2 end
moved(r[1], 'd')
r[1] = 'd'
r[4] = ''
r[7] = now
redis.call('HSET', KEYS[1], pid, encode(r))
redis.call('ZREM', KEYS[2], pid)
count(KEYS[3])
return 1
