-- Changes the namespace's control record (settings or the manual throttle) and logs it.
--
-- KEYS[1]  {ns}:control: the record, one JSON object {version, settings, manual, probe}.
-- KEYS[2]  {ns}:control:log: a stream of the last 100 changes (at_ms, origin, change,
--          version).
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  origin: who made the change ("host/pid/user"), 1 to 512 bytes.
-- ARGV[3]  the change: a JSON object of settings to set (a value) or clear (null), and
--          optionally "manual": {"on": bool, "reason": string}.
--
-- Returns the new record as JSON. Every argument, the stored record and the merged
-- settings are checked before the first write: a refused change writes nothing.

local now = tonumber(ARGV[1])
local origin = ARGV[2]
if now == nil or now ~= math.floor(now) or now < 0 or now > 1e14 then
    return redis.error_reply('ERR tranche set: now_ms must be an integer')
end
if origin == nil or #origin == 0 or #origin > 512 then
    return redis.error_reply('ERR tranche set: origin must be 1 to 512 bytes')
end
local ok, change = pcall(cjson.decode, ARGV[3] or '')
if not ok or type(change) ~= 'table' then
    return redis.error_reply('ERR tranche set: the change is not a JSON object')
end

local record = { version = 0, settings = {} }
local stored = redis.call('GET', KEYS[1])
if stored then
    local good, decoded = pcall(cjson.decode, stored)
    if not good or type(decoded) ~= 'table' or type(decoded.version) ~= 'number'
        or type(decoded.settings) ~= 'table' then
        return redis.error_reply('ERR tranche set: the stored control record is corrupt')
    end
    record = decoded
end

local function integer_in(v, lo, hi)
    return type(v) == 'number' and v == math.floor(v) and v >= lo and v <= hi
end
local function positive(v)
    return type(v) == 'number' and v == v and v > 0 and v <= 1e12
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

local manual = nil
local changed = 0
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
        if value == cjson.null then
            record.settings[name] = nil
        else
            record.settings[name] = value
        end
    end
    changed = changed + 1
end
if changed == 0 then
    return redis.error_reply('ERR tranche set: nothing to change')
end
local s = record.settings
if s.chunk_min and s.chunk_max and s.chunk_min > s.chunk_max then
    return redis.error_reply('ERR tranche set: chunk_min is above chunk_max')
end

-- Checked: from here on the script writes.
if manual then
    if manual.on then
        -- A throttle already on keeps its start time; a new reason replaces the old one.
        local since = now
        if type(record.manual) == 'table' and type(record.manual.since_ms) == 'number' then
            since = record.manual.since_ms
        end
        record.manual = { reason = manual.reason or '', since_ms = since, origin = origin }
    else
        record.manual = nil
    end
end
record.version = record.version + 1
local encoded = cjson.encode(record)
redis.call('SET', KEYS[1], encoded)
redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
    'origin', origin, 'change', ARGV[3], 'version', string.format('%d', record.version))
return encoded
