-- repair: set a shard's damaged statistics values aside and rebuild them (check --repair).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- KEYS[6]    {ns:s}:stats:quarantine, a hash: '<hash>:<field>@<now_ms>' -> the bad value
-- ARGV[1]    'whole' (replace the shard by the delta) or 'patch' (rebuild the damaged
--            values only, from the delta, and keep the others)
-- ARGV[2]    now_ms, the quarantine stamp
-- ARGV[3]    m, then m pairs: the damaged value's key (1..5, KEYS[j]) and field
-- ARGV[4 + 2m] n, then the n delta arguments (delta_args) of the rebuilt statistics
-- Reply: the number of values set aside.
-- Everything is read and planned first, with the damaged values (every value, for
-- 'whole') read as absent, so none of them is ever decoded; then each damaged value is
-- copied into the quarantine and deleted, and the plan's writes are issued. A refused
-- call writes nothing.
local mode, now = ARGV[1], ARGV[2]
if mode ~= 'whole' and mode ~= 'patch' then
  error('repair: mode ' .. tostring(mode) .. ' is neither whole nor patch; nothing was written')
end
if not now or not string.match(now, '^%d+$') or #now > 18 then
  error('repair: malformed time ' .. tostring(now) .. '; nothing was written')
end
local m = tonumber(ARGV[3])
if not m or m < 0 or m ~= math.floor(m) or #ARGV < 2 * m + 4 then
  error('repair: malformed damage count ' .. tostring(ARGV[3]) .. '; nothing was written')
end
local qtype = redis.call('TYPE', KEYS[6]).ok
if qtype ~= 'hash' and qtype ~= 'none' then
  error('repair: ' .. KEYS[6] .. ' is not a hash; nothing was written')
end
local hashes = {'global', 'workers', 'ranges', 'hourly', 'hist'}
local mask, damaged = {}, {}
for d = 1, m do
  local j, field = tonumber(ARGV[2 + 2 * d]), ARGV[3 + 2 * d]
  if not j or not hashes[j] then
    error('repair: damaged key ' .. tostring(ARGV[2 + 2 * d]) .. ' is not 1..5; nothing was written')
  end
  mask[j] = mask[j] or {}
  mask[j][field] = true
  -- Read now (a key of another type fails here, before any write).
  damaged[d] = {j, field, redis.call('HGET', KEYS[j], field)}
end
if mode == 'whole' then mask = true end
local writes, after = stats_plan(1, 4 + 2 * m, mask)
if after ~= #ARGV + 1 then
  error('repair: ' .. (#ARGV + 1 - after) .. ' arguments after the delta; nothing was written')
end
local moved = 0
for _, d in ipairs(damaged) do
  if d[3] then
    redis.call('HSET', KEYS[6], hashes[d[1]] .. ':' .. d[2] .. '@' .. now, d[3])
    redis.call('HDEL', KEYS[d[1]], d[2])
    moved = moved + 1
  end
end
if mode == 'whole' then redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) end
stats_write(writes)
return moved
