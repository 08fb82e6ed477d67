-- register.lua: records a new namespace's shard count and key layout, once.
--
-- KEYS[1] = {ns}:meta
-- ARGV[1] = the shard count, ARGV[2] = the key layout's version
--
-- Both are fixed for the namespace's life: every shard key's name depends on them. A
-- namespace recorded already keeps what it has; a namespace planned before layouts were
-- recorded has `shards` and no `layout` (version 1) and must keep it so, so `layout` is
-- only ever written together with `shards`. Returns what is recorded, `layout` nil
-- for version 1, for the caller to refuse a difference. Every argument, and what is
-- recorded, is checked before the one write.
local function positive(v)
  return string.match(v or '', '^[1-9]%d*$') and #v <= 9
end
if #ARGV ~= 2 or not positive(ARGV[1]) or not positive(ARGV[2]) then
  return redis.error_reply('ERR register: the shard count and layout must be positive integers')
end
local shards = redis.call('HGET', KEYS[1], 'shards')
if not shards then
  redis.call('HSET', KEYS[1], 'shards', ARGV[1], 'layout', ARGV[2])
  return {ARGV[1], ARGV[2]}
end
if not positive(shards) then
  return redis.error_reply('ERR register: ' .. KEYS[1] .. ' records shards `' .. shards .. '`')
end
return {shards, redis.call('HGET', KEYS[1], 'layout')}
