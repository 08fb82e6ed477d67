-- Elects the worker of a namespace whose probe drives the AIMD rate, or renews its term.
--
-- KEYS[1]  {ns}:control:prober: the leading worker's id, expiring after its term.
-- ARGV[1]  the worker asking: a non-empty string of at most 256 bytes.
-- ARGV[2]  the term in milliseconds: an integer in [1, 3600000] (three probe intervals).
--
-- Returns {leads, repaired}: leads is 1 when ARGV[1] leads (newly elected or renewed), 0
-- when another worker does; repaired is 1 when the key had no TTL (written by hand or by
-- a foreign tool) and got the term as one, so a holder that died cannot keep the lead
-- for ever.

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
    return { 1, 0 }
end
local repaired = 0
if redis.call('PTTL', KEYS[1]) < 0 then
    repaired = 1
end
if holder == worker or repaired == 1 then
    redis.call('PEXPIRE', KEYS[1], ttl)
end
if holder == worker then
    return { 1, repaired }
end
return { 0, repaired }
