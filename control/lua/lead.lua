-- Elects the one worker of a namespace that runs the throttle probes, or renews its term.
--
-- KEYS[1]  {ns}:control:prober: the leading worker's id, expiring after its term.
-- ARGV[1]  the worker asking: a non-empty string of at most 256 bytes.
-- ARGV[2]  the term in milliseconds: an integer in [1, 3600000] (three probe intervals).
--
-- Returns 1 when ARGV[1] leads (newly elected or renewed), 0 when another worker does.

local worker = ARGV[1]
local ttl = tonumber(ARGV[2])
if worker == nil or #worker == 0 or #worker > 256 then
    return redis.error_reply('ERR tranche lead: worker must be 1 to 256 bytes')
end
if ttl == nil or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 3600000 then
    return redis.error_reply('ERR tranche lead: ttl must be an integer in [1, 3600000]')
end

local holder = redis.call('GET', KEYS[1])
if holder == false then
    redis.call('SET', KEYS[1], worker, 'PX', ttl)
    return 1
end
if holder == worker then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return 1
end
return 0
