-- recount: derive one shard's status counters from its records and mark them exact.
-- Run once for a shard written before the counters existed (no field v), or on demand
-- after writers that did not keep them (a rolling upgrade). Reads every record, so it
-- costs what the active set holds; afterwards every script keeps the counters.
-- KEYS[1] active hash   KEYS[2] status counters hash
-- ARGV none
-- Reply: {pending, claimed, running, failed, discarded}
local n = {p = 0, c = 0, r = 0, f = 0, d = 0}
for _, rec in ipairs(redis.call('HVALS', KEYS[1])) do
  -- The status is the record's first byte (record.lua); anything else is not counted.
  local status = string.sub(rec, 1, 1)
  if n[status] then n[status] = n[status] + 1 end
end
redis.call('HSET', KEYS[2], 'p', n.p, 'c', n.c, 'r', n.r, 'f', n.f, 'd', n.d, 'v', 1)
return {n.p, n.c, n.r, n.f, n.d}
