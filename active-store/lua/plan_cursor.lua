-- plan_cursor: make a uniform plan's pid range known to one shard, whose claims then
-- issue that shard's pids from a cursor. Idempotent: a range already there is left as is
-- (with its cursor), so replaying a plan after a crash never reissues work.
-- KEYS[1] the shard's plans list   ARGV[1] "first|last"
-- Reply: 1 if added, 0 if it was there.
for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if e == ARGV[1] then return 0 end
end
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
