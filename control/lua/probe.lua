-- Records what the namespace's probes found, from the worker that leads them.
--
-- KEYS[1]  {ns}:control: the record (see set.lua); this script writes only `probe`.
-- KEYS[2]  {ns}:control:log: the change log; a throttle that starts or ends is logged.
-- KEYS[3]  {ns}:control:prober: the leading worker (see lead.lua).
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  the reporting worker, 1 to 256 bytes.
-- ARGV[3]  the report: a JSON object {throttle: reason|null, value: number|null,
--          error: string|null, rate: number|null}.
--
-- Returns 1 when written, 0 when ARGV[2] does not lead the probes: a worker whose term
-- ran out while it probed cannot overwrite its successor's finding (nothing is written).

local now = tonumber(ARGV[1])
local worker = ARGV[2]
if now == nil or now ~= math.floor(now) or now < 0 or now > 1e14 then
    return redis.error_reply('ERR tranche probe: now_ms must be an integer')
end
if worker == nil or #worker == 0 or #worker > 256 then
    return redis.error_reply('ERR tranche probe: worker must be 1 to 256 bytes')
end
local ok, report = pcall(cjson.decode, ARGV[3] or '')
if not ok or type(report) ~= 'table' then
    return redis.error_reply('ERR tranche probe: the report is not a JSON object')
end
local function opt(v, kind)
    return v == nil or v == cjson.null or type(v) == kind
end
if not (opt(report.throttle, 'string') and opt(report.value, 'number')
        and opt(report.error, 'string') and opt(report.rate, 'number')) then
    return redis.error_reply('ERR tranche probe: report fields have the wrong types')
end
if type(report.rate) == 'number' and not (report.rate > 0 and report.rate <= 1e12) then
    return redis.error_reply('ERR tranche probe: rate must be in (0, 1e12]')
end
if type(report.throttle) == 'string' and #report.throttle > 512 then
    return redis.error_reply('ERR tranche probe: the reason is over 512 bytes')
end

local record = { version = 0, settings = {} }
local stored = redis.call('GET', KEYS[1])
if stored then
    local good, decoded = pcall(cjson.decode, stored)
    if not good or type(decoded) ~= 'table' or type(decoded.version) ~= 'number'
        or type(decoded.settings) ~= 'table' then
        return redis.error_reply('ERR tranche probe: the stored control record is corrupt')
    end
    record = decoded
end
if redis.call('GET', KEYS[3]) ~= worker then
    return 0
end

-- Checked: from here on the script writes.
local was = nil
if type(record.probe) == 'table' and type(record.probe.throttled) == 'table' then
    was = record.probe.throttled
end
local probe = { at_ms = now, worker = worker }
if type(report.value) == 'number' then probe.value = report.value end
if type(report.error) == 'string' then probe.error = report.error end
if type(report.rate) == 'number' then probe.rate = report.rate end
if type(report.throttle) == 'string' then
    local since = now
    if was and type(was.since_ms) == 'number' then since = was.since_ms end
    probe.throttled = { reason = report.throttle, since_ms = since }
end
record.probe = probe
record.version = record.version + 1
redis.call('SET', KEYS[1], cjson.encode(record))
local is = probe.throttled ~= nil
if (was ~= nil) ~= is then
    local change = 'probe throttle off'
    if is then change = 'probe throttle on: ' .. report.throttle end
    redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
        'origin', 'probe@' .. worker, 'change', change, 'version',
        string.format('%d', record.version))
end
return 1
