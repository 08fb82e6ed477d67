-- plan_cursor: make a uniform plan's pid range known to one shard, whose claims then
-- issue that shard's pids from a cursor. Idempotent: a range already there is left as is
-- (with its cursor), so replaying a plan after a crash never reissues work. The range may
-- be there in pieces: discarding a pid not issued yet splits its entry around it.
-- KEYS[1] the shard's plans list   ARGV[1] "first|last"
-- Reply: 1 if added, 0 if it was there.
-- The argument and every entry read are checked before the one write.
if #ARGV ~= 1 then refuse('argument count', #ARGV) end
local first, last = string.match(ARGV[1], '^(%d+)|(%d+)$')
if not first or not is_num(first) or not is_num(last) or tonumber(first) > tonumber(last) then
  refuse('plan range', ARGV[1])
end
first, last = tonumber(first), tonumber(last)
for i, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local a, b = string.match(e, '^(%d+)|(%d+)$')
  if not a or not is_num(a) or not is_num(b) then corrupt(KEYS[1], i - 1, 'plan entry `' .. e .. '`') end
  -- Plans never overlap, so an entry within the range is a piece of it.
  if tonumber(a) >= first and tonumber(b) <= last then return 0 end
end
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
