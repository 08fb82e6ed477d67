-- Replaces a control record that broke the rules with a repaired one, keeping the old.
--
-- KEYS[1]  {ns}:control: the record.
-- KEYS[2]  {ns}:control:log: the change log (the repair is logged).
-- KEYS[3]  {ns}:control:quarantine: the replaced record, kept 7 days.
-- ARGV[1]  now_ms: the client clock, an integer in [0, 1e14].
-- ARGV[2]  origin: who repairs, 1 to 512 bytes.
-- ARGV[3]  the record as the caller read it: the repair applies only if it is still the
--          stored one (a change in between wins; the caller reads again).
-- ARGV[4]  the repaired record: a JSON object with an integer version and a settings
--          object (the caller built it by the readers' rules).
-- ARGV[5]  what was repaired, for the log (1 to 4096 bytes).
--
-- Returns 1 when replaced, 0 when the stored record changed since the caller read it.

local now = ms_arg(ARGV[1])
local origin = ARGV[2]
if now == nil then
    return redis.error_reply('ERR tranche repair: now_ms must be an integer')
end
if origin == nil or #origin == 0 or #origin > 512 then
    return redis.error_reply('ERR tranche repair: origin must be 1 to 512 bytes')
end
if ARGV[3] == nil or ARGV[5] == nil or #ARGV[5] == 0 or #ARGV[5] > 4096 then
    return redis.error_reply('ERR tranche repair: the old record and a note are required')
end
local ok, repaired = pcall(cjson.decode, ARGV[4] or '')
if not ok or type(repaired) ~= 'table' or type(repaired.settings) ~= 'table'
    or type(repaired.version) ~= 'number' or repaired.version ~= math.floor(repaired.version)
    or repaired.version < 0 or repaired.version > 1e14 then
    return redis.error_reply('ERR tranche repair: the repaired record is not a record')
end
if redis.call('GET', KEYS[1]) ~= ARGV[3] then
    return 0
end

-- Checked: from here on the script writes.
redis.call('SET', KEYS[3], ARGV[3], 'PX', 604800000)
redis.call('SET', KEYS[1], ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '100', '*', 'at_ms', string.format('%d', now),
    'origin', origin, 'change', ARGV[5], 'version', string.format('%d', repaired.version))
return 1
