-- Reserves units of one fleet-wide rate limit: GCRA with reservations.
--
-- KEYS[1]  {ns}:control:rate:<limit>: the limit's theoretical arrival time (TAT), the
--          server-clock microsecond at which the fleet's next unit may be used.
-- ARGV[1]  rate: units per second, a number in [1e-4, 1e12] (Rate::MIN, Rate::MAX).
-- ARGV[2]  units to reserve: an integer in [1, 1e12].
-- ARGV[3]  burst: how far in the past (microseconds, an integer in [0, 3.6e9]) a
--          reservation may start, so an idle limit lends at most that much catch-up.
--
-- Returns the reservation's start relative to the server's now, in microseconds (an
-- integer, negative only within the burst): unit i of the reservation may be used at
-- start + i / rate. The script moves the TAT by units / rate, so reservations of the
-- whole fleet never overlap and the fleet uses at most rate * window + one reservation's
-- first unit per client in any window.
--
-- Server time (TIME), not the client's: every client of a namespace compares against one
-- clock (the master holding the `{ns}` slot), so a client whose clock is skewed neither
-- steals capacity nor waits for nothing. The client turns the offset into its own
-- monotonic time, which leaves only the one-way latency as error.

local rate = tonumber(ARGV[1])
local units = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
if rate == nil or rate ~= rate or rate < 1e-4 or rate > 1e12 then
    return redis.error_reply('ERR tranche take: rate must be a number in [1e-4, 1e12]')
end
if units == nil or units ~= math.floor(units) or units < 1 or units > 1e12 then
    return redis.error_reply('ERR tranche take: units must be an integer in [1, 1e12]')
end
if burst == nil or burst ~= math.floor(burst) or burst < 0 or burst > 3.6e9 then
    return redis.error_reply('ERR tranche take: burst must be an integer in [0, 3.6e9]')
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local stored = redis.call('GET', KEYS[1])
local tat = now
if stored then
    tat = tonumber(stored)
    -- A TAT that is not a number would make every later reservation wrong: refuse.
    if tat == nil or tat ~= tat then
        return redis.error_reply('ERR tranche take: the stored TAT is not a number')
    end
end
if tat < now - burst then
    tat = now - burst
end

local start = tat
local next_tat = tat + units * 1000000 / rate
-- The key outlives its last reservation by a minute, then an idle limit costs nothing.
-- At the smallest rate a reservation can reach 10^22 us ahead: the TTL is capped at
-- 10^15 ms (31 700 years, within what PX takes) and the answer at 10^15 us (31 years,
-- within an integer reply), so neither errors nor wraps to a start in the past.
local ttl_ms = math.min(math.floor((next_tat - now) / 1000) + 60000, 1e15)
redis.call('SET', KEYS[1], string.format('%.0f', next_tat), 'PX', ttl_ms)
return math.min(math.floor(start - now), 1e15)
