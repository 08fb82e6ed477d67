-- range: one 100,000-ID range's statistics on one shard, in one round trip.
-- KEYS[1] {ns:s}:stats:workers hash   KEYS[2] {ns:s}:stats:ranges hash
-- ARGV[1] the range number r (decimal)
-- Reply: count, dur, min, max, first, last (nil when absent), then for every worker
-- of the shard that completed something in the range: worker, count, dur, ids.
local r = ARGV[1]
local base = redis.call('HMGET', KEYS[2], r .. '|count', r .. '|dur', r .. '|min',
  r .. '|max', r .. '|first', r .. '|last')
if not base[1] then return {} end
local workers = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  local w = string.match(f, '^(.*)|count$')
  if w then workers[#workers + 1] = w end
end
local out = base
for _, w in ipairs(workers) do
  local p = r .. '|w|' .. w .. '|'
  local v = redis.call('HMGET', KEYS[2], p .. 'count', p .. 'dur', p .. 'ids')
  if v[1] then
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = w, v[1], v[2] or '0', v[3] or '0'
  end
end
return out
