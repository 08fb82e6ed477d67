-- Changes the namespace's control record (settings or the manual throttle) and logs it.
--
-- KEYS[1]  {ns}:control: the record, one JSON object {version, settings, manual, probe,
--          probes}.
-- KEYS[2]  {ns}:control:log: a stream of the last 100 changes (at_ms, origin, change,
--          version).
-- KEYS[3]  {ns}:control:quarantine: where a stored record that is not JSON is kept
--          (7 days) when this change replaces it.
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  origin: who made the change ("host/pid/user"), 1 to 512 bytes.
-- ARGV[3]  the change: a JSON object of settings to set (a value) or clear (null), and
--          optionally "manual": {"on": bool, "reason": string}.
-- ARGV[4]  optional since_ms, an integer in [0, 1e14]: a setting the log shows changed
--          after it is left as it is (a worker's start-up option never overwrites a
--          newer change); when the log no longer reaches back to since_ms, every
--          setting counts as changed.
--
-- Returns {record JSON, skipped settings JSON array}. Every argument is checked before
-- the first write, and a refused change writes nothing. A stored record is not a
-- reason to refuse: its values that break the rules below are dropped one by one (the
-- rest kept), and one that is not JSON at all is quarantined and replaced.

local now = ms_arg(ARGV[1])
local origin = ARGV[2]
if now == nil then
    return redis.error_reply('ERR tranche set: now_ms must be an integer')
end
if origin == nil or #origin == 0 or #origin > 512 then
    return redis.error_reply('ERR tranche set: origin must be 1 to 512 bytes')
end
local since = nil
if ARGV[4] ~= nil then
    since = ms_arg(ARGV[4])
    if since == nil then
        return redis.error_reply('ERR tranche set: since_ms must be an integer')
    end
end
local ok, change = pcall(cjson.decode, ARGV[3] or '')
if not ok or type(change) ~= 'table' then
    return redis.error_reply('ERR tranche set: the change is not a JSON object')
end

local function integer_in(v, lo, hi)
    return type(v) == 'number' and v == math.floor(v) and v >= lo and v <= hi
end
-- Rate::MIN and Rate::MAX.
local function positive(v)
    return type(v) == 'number' and v == v and v >= 1e-4 and v <= 1e12
end
local function hours(v)
    if type(v) ~= 'string' then return false end
    local h1, m1, h2, m2 = string.match(v, '^(%d%d):(%d%d)%-(%d%d):(%d%d)$')
    if h1 == nil then return false end
    h1, m1, h2, m2 = tonumber(h1), tonumber(m1), tonumber(h2), tonumber(m2)
    return h1 < 24 and h2 < 24 and m1 < 60 and m2 < 60 and (h1 ~= h2 or m1 ~= m2)
end
local function zone(v)
    return type(v) == 'string' and #v > 0 and #v <= 64 and string.match(v, '^[%w_/+%-]+$') ~= nil
end
local checks = {
    max_rate = positive,
    max_partitions_rate = positive,
    keep_below = function(v) return type(v) == 'number' and v == v and v >= -1e15 and v <= 1e15 end,
    concurrency = function(v) return integer_in(v, 1, 65536) end,
    parallel = function(v) return integer_in(v, 1, 65536) end,
    chunk = function(v) return integer_in(v, 1, 1e12) end,
    chunk_min = function(v) return integer_in(v, 1, 1e12) end,
    chunk_max = function(v) return integer_in(v, 1, 1e12) end,
    chunk_time_ms = function(v) return integer_in(v, 1, 86400000) end,
    active_hours = hours,
    tz = zone,
}

-- The change, checked whole.
local manual = nil
local names = {}
for name, value in pairs(change) do
    if name == 'manual' then
        if type(value) ~= 'table' or type(value.on) ~= 'boolean'
            or (value.reason ~= nil and (type(value.reason) ~= 'string' or #value.reason > 512)) then
            return redis.error_reply('ERR tranche set: manual must be {on: bool, reason: string}')
        end
        manual = value
    else
        local check = checks[name]
        if check == nil then
            return redis.error_reply('ERR tranche set: unknown setting ' .. tostring(name))
        end
        if value ~= cjson.null and not check(value) then
            return redis.error_reply('ERR tranche set: invalid value for ' .. name)
        end
        names[#names + 1] = name
    end
end
if manual == nil and #names == 0 then
    return redis.error_reply('ERR tranche set: nothing to change')
end

-- The stored record, its bad values dropped one by one (the readers' rules).
local record = { version = 0, settings = {} }
local quarantine = nil
local stored = redis.call('GET', KEYS[1])
if stored then
    local good, decoded = false, nil
    if #stored <= 262144 then good, decoded = pcall(cjson.decode, stored) end
    if not good or type(decoded) ~= 'table' or decoded[1] ~= nil
        or not sound(decoded, 0) then
        quarantine = stored
    else
        -- Only the record's own fields are kept; anything else a foreign writer added
        -- is dropped, as the readers drop it.
        record = { version = decoded.version, settings = decoded.settings,
            manual = decoded.manual, probe = decoded.probe, probes = decoded.probes }
        -- From 1e14 on the version restarts (cjson keeps 14 digits).
        if not integer_in(record.version, 0, 1e14 - 1) then record.version = 0 end
        if type(record.settings) ~= 'table' then record.settings = {} end
        for name, value in pairs(record.settings) do
            local check = checks[name]
            if check == nil or not check(value) then record.settings[name] = nil end
        end
        local s = record.settings
        if s.chunk_min and s.chunk_max and s.chunk_min > s.chunk_max then
            s.chunk_min, s.chunk_max = nil, nil
        end
    end
end

-- Settings changed since `since` stay as they are.
local skipped = {}
if since ~= nil and #names > 0 then
    local entries = redis.call('XRANGE', KEYS[2], '-', '+')
    local touched = {}
    local all = false
    if #entries >= 100 then
        local first = nil
        for i = 1, #entries[1][2], 2 do
            if entries[1][2][i] == 'at_ms' then first = tonumber(entries[1][2][i + 1]) end
        end
        if first == nil or first > since then all = true end
    end
    for _, entry in ipairs(entries) do
        local fields = {}
        for i = 1, #entry[2], 2 do fields[entry[2][i]] = entry[2][i + 1] end
        local at = tonumber(fields.at_ms or '')
        if at == nil or at > since then
            local parsed, logged = pcall(cjson.decode, fields.change or '')
            if parsed and type(logged) == 'table' then
                for name, _ in pairs(logged) do touched[name] = true end
            end
        end
    end
    local kept = {}
    for _, name in ipairs(names) do
        if all or touched[name] then
            skipped[#skipped + 1] = name
            change[name] = nil
        else
            kept[#kept + 1] = name
        end
    end
    names = kept
end
local effective = ARGV[3]
if #skipped > 0 then effective = cjson.encode(change) end
local skipped_json = '[]'
if #skipped > 0 then skipped_json = cjson.encode(skipped) end
if manual == nil and #names == 0 then
    return { cjson.encode(record), skipped_json }
end

for _, name in ipairs(names) do
    if change[name] == cjson.null then
        record.settings[name] = nil
    else
        record.settings[name] = change[name]
    end
end
local s = record.settings
if s.chunk_min and s.chunk_max and s.chunk_min > s.chunk_max then
    return redis.error_reply('ERR tranche set: chunk_min is above chunk_max')
end

-- Checked: from here on the script writes.
if quarantine then
    redis.call('SET', KEYS[3], quarantine, 'PX', 604800000)
end
if manual then
    if manual.on then
        -- A throttle already on keeps its start time; a new reason replaces the old one.
        local since_ms = now
        if type(record.manual) == 'table' and integer_in(record.manual.since_ms, 0, 1e14) then
            since_ms = record.manual.since_ms
        end
        record.manual = { reason = manual.reason or '', since_ms = since_ms, origin = origin }
    else
        record.manual = nil
    end
end
record.version = record.version + 1
local encoded = cjson.encode(record)
redis.call('SET', KEYS[1], encoded)
redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
    'origin', origin, 'change', effective, 'version', string.format('%d', record.version))
return { encoded, skipped_json }
