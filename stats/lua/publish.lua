-- publish: store snapshot version n, make it the latest unless a newer one already is,
-- and drop the version that falls out of the kept window.
-- KEYS[1] {ns}:stats:snapshot:v{n}   KEYS[2] {ns}:stats:latest   KEYS[3] {ns}:stats:config
-- KEYS[4] {ns}:stats:snapshot:v{n - kept} (absent while n <= kept)
-- ARGV[1] n   ARGV[2] the snapshot JSON   ARGV[3] the config JSON
-- Versions come from INCR on {ns}:stats:version before this runs, so two publishers
-- never share one; `latest` only moves forward, so a slow publisher cannot roll it back.
redis.call('SET', KEYS[1], ARGV[2])
local cur = redis.call('GET', KEYS[2])
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1])
  redis.call('SET', KEYS[3], ARGV[3])
end
if KEYS[4] then redis.call('DEL', KEYS[4]) end
return 1
