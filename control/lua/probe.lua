-- Records one worker's probe finding; the leading prober's also carries the AIMD rate.
--
-- KEYS[1]  {ns}:control: the record (see set.lua); this script writes only `version`,
--          `probes` and `probe`.
-- KEYS[2]  {ns}:control:log: the change log; a worker's throttle that starts or ends is
--          logged.
-- KEYS[3]  {ns}:control:prober: the leading worker (see lead.lua).
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  the reporting worker, 1 to 256 bytes.
-- ARGV[3]  the report: a JSON object {throttle: reason|null, value: number|null,
--          error: string|null, rate: number|null, ttl_ms: integer|null}. A reason or
--          error over 512 bytes is cut and marked, never refused; ttl_ms (how long the
--          finding is live unless renewed) is in [1, 3600000], 30000 when null.
--
-- Every worker's finding is kept under its name in `probes` (at most 64, the oldest
-- dropped), so a throttle from any live prober holds the fleet. Only the worker holding
-- KEYS[3] writes `probe` and its rate: a worker whose term ran out while it probed
-- cannot overwrite its successor's rate. A stored record that is not JSON is refused
-- (a reporter must not erase a throttle it cannot read); its bad fields otherwise are
-- left to the readers, which drop them.
--
-- Returns 1 when ARGV[2] leads, 0 when only its own finding was written.

local now = ms_arg(ARGV[1])
local worker = ARGV[2]
if now == nil then
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
        and opt(report.error, 'string') and opt(report.rate, 'number')
        and opt(report.ttl_ms, 'number')) then
    return redis.error_reply('ERR tranche probe: report fields have the wrong types')
end
local ttl = 30000
if type(report.ttl_ms) == 'number' then
    ttl = report.ttl_ms
    if ttl ~= math.floor(ttl) or ttl < 1 or ttl > 3600000 then
        return redis.error_reply('ERR tranche probe: ttl_ms must be an integer in [1, 3600000]')
    end
end
local function cut(text)
    if type(text) ~= 'string' then return nil end
    if #text <= 512 then return text end
    -- Back off to the start of a UTF-8 character, then mark the cut.
    local stop = 512 - #'…(truncated)'
    while stop > 0 and string.byte(text, stop + 1) >= 128 and string.byte(text, stop + 1) < 192 do
        stop = stop - 1
    end
    return string.sub(text, 1, stop) .. '…(truncated)'
end
local reason = cut(report.throttle)
local err = cut(report.error)
local value = nil
if type(report.value) == 'number' and report.value == report.value
    and report.value > -1e300 and report.value < 1e300 then
    value = report.value
end
-- The rate is computed by the worker, not printed by a probe: out of range is refused.
-- Rate::MIN and Rate::MAX.
local rate = nil
if type(report.rate) == 'number' then
    if not (report.rate >= 1e-4 and report.rate <= 1e12) then
        return redis.error_reply('ERR tranche probe: rate must be in [1e-4, 1e12]')
    end
    rate = report.rate
end

local record = { version = 0, settings = {} }
local stored = redis.call('GET', KEYS[1])
if stored then
    local good, decoded = false, nil
    if #stored <= 262144 then good, decoded = pcall(cjson.decode, stored) end
    if not good or type(decoded) ~= 'table' or decoded[1] ~= nil
        or not sound(decoded, 0) then
        return redis.error_reply('ERR tranche probe: the stored control record is not JSON')
    end
    record = decoded
    local v = record.version
    -- From 1e14 on the version restarts (cjson keeps 14 digits).
    if type(v) ~= 'number' or v ~= math.floor(v) or v < 0 or v >= 1e14 then
        record.version = 0
    end
end
-- `probes` that is not an object (a JSON array too) is replaced, as readers ignore it.
if type(record.probes) ~= 'table' or record.probes[1] ~= nil then record.probes = {} end
local leads = redis.call('GET', KEYS[3]) == worker

-- Checked: from here on the script writes.
local previous = record.probes[worker]
local was = nil
if type(previous) == 'table' and type(previous.throttled) == 'table' then
    was = previous.throttled
end
local finding = { at_ms = now, expires_ms = now + ttl, worker = worker }
if value ~= nil then finding.value = value end
if err ~= nil then finding.error = err end
if reason ~= nil then
    local since = now
    local kept = was and was.since_ms
    if type(kept) == 'number' and kept == math.floor(kept) and kept >= 0 and kept <= 1e14 then
        since = kept
    end
    finding.throttled = { reason = reason, since_ms = since }
end
record.probes[worker] = finding
-- At most 64 findings: the oldest (and any unreadable one) go first.
while true do
    local count, oldest, oldest_at = 0, nil, nil
    for name, f in pairs(record.probes) do
        count = count + 1
        local at = -1
        if type(f) == 'table' and type(f.at_ms) == 'number' then at = f.at_ms end
        if oldest == nil or at < oldest_at then oldest, oldest_at = name, at end
    end
    if count <= 64 then break end
    record.probes[oldest] = nil
end
if leads then
    local lead = { at_ms = now, expires_ms = now + ttl, worker = worker,
        value = finding.value, error = finding.error, throttled = finding.throttled }
    if rate ~= nil then lead.rate = rate end
    record.probe = lead
end
record.version = record.version + 1
redis.call('SET', KEYS[1], cjson.encode(record))
local is = finding.throttled ~= nil
if (was ~= nil) ~= is then
    local change = 'probe throttle off'
    if is then change = 'probe throttle on: ' .. reason end
    redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
        'origin', 'probe@' .. worker, 'change', change, 'version',
        string.format('%d', record.version))
end
if leads then return 1 end
return 0
