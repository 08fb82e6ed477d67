-- Removes a worker's probe finding when it stops cleanly, and gives up its lead.
--
-- KEYS[1]  {ns}:control: the record (see set.lua); this script writes only `version`
--          and `probes`.
-- KEYS[2]  {ns}:control:log: the change log; a retired throttle is logged.
-- KEYS[3]  {ns}:control:prober: the leading worker (see lead.lua), deleted when it is
--          ARGV[2].
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  the stopping worker, 1 to 256 bytes.
--
-- A finding nobody renews goes stale and throttles the fleet: right for a prober that
-- died, wrong for one that stopped on purpose, which retires its finding instead.
-- Returns 1 when a finding was removed, 0 when there was none. A stored record that is
-- not JSON is refused, as in probe.lua.

local now = ms_arg(ARGV[1])
local worker = ARGV[2]
if now == nil then
    return redis.error_reply('ERR tranche retire: now_ms must be an integer')
end
if worker == nil or #worker == 0 or #worker > 256 then
    return redis.error_reply('ERR tranche retire: worker must be 1 to 256 bytes')
end
local stored = redis.call('GET', KEYS[1])
local record = nil
if stored then
    local good, decoded = false, nil
    if #stored <= 262144 then good, decoded = pcall(cjson.decode, stored) end
    if not good or type(decoded) ~= 'table' or decoded[1] ~= nil
        or not sound(decoded, 0) then
        return redis.error_reply('ERR tranche retire: the stored control record is not JSON')
    end
    record = decoded
end
local leads = redis.call('GET', KEYS[3]) == worker

-- Checked: from here on the script writes.
if leads then redis.call('DEL', KEYS[3]) end
if record == nil or type(record.probes) ~= 'table' or record.probes[worker] == nil then
    return 0
end
local finding = record.probes[worker]
record.probes[worker] = nil
local v = record.version
-- From 1e14 on the version restarts (cjson keeps 14 digits).
if type(v) ~= 'number' or v ~= math.floor(v) or v < 0 or v >= 1e14 then v = 0 end
record.version = v + 1
redis.call('SET', KEYS[1], cjson.encode(record))
if type(finding) == 'table' and type(finding.throttled) == 'table' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
        'origin', 'probe@' .. worker, 'change', 'probe throttle off: retired', 'version',
        string.format('%d', record.version))
end
return 1
