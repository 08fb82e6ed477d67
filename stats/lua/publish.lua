-- publish: store snapshot version n, make it the latest unless a newer one already is,
-- and drop the version that falls out of the kept window.
-- KEYS[1] {ns}:stats:snapshot:v{n}   KEYS[2] {ns}:stats:latest   KEYS[3] {ns}:stats:config
-- KEYS[4] {ns}:stats:snapshot:v{n - kept} (absent while n <= kept)
-- ARGV[1] n   ARGV[2] the snapshot JSON   ARGV[3] the config JSON
-- Versions come from INCR on {ns}:stats:version before this runs, so two publishers
-- never share one; `latest` only moves forward, so a slow publisher cannot roll it back.
-- Everything is checked before the first write: a version that is not a positive
-- decimal, an empty snapshot or config, a `latest` that does not hold a version.
local n = ARGV[1]
if not n or not string.match(n, '^[1-9]%d*$') or #n > 18 then
  error('publish: version ' .. tostring(n) .. ' is not a positive integer; nothing was written')
end
if not ARGV[2] or ARGV[2] == '' or not ARGV[3] or ARGV[3] == '' then
  error('publish: an empty snapshot or config; nothing was written')
end
if #ARGV ~= 3 or #KEYS < 3 or #KEYS > 4 then
  error('publish: takes 3 or 4 keys and 3 arguments; nothing was written')
end
local cur = redis.call('GET', KEYS[2])
if cur and (not string.match(cur, '^%d+$') or #cur > 18) then
  error('publish: ' .. KEYS[2] .. ' does not hold a version; nothing was written')
end
redis.call('SET', KEYS[1], ARGV[2])
if not cur or tonumber(cur) < tonumber(n) then
  redis.call('SET', KEYS[2], n)
  redis.call('SET', KEYS[3], ARGV[3])
end
if KEYS[4] then redis.call('DEL', KEYS[4]) end
return 1
