-- get: everything the archive knows about one pid, in one round trip.
-- KEYS[1] completed index bitmap (set by the active store)   KEYS[2] archived bitmap
--      KEYS[3] simple-tier hash   KEYS[4] sealed batch string   KEYS[5] open batch hash
--      KEYS[6] the batch's segment string
-- ARGV[1] pid   ARGV[2] bit offset
-- Reply: {index bit, archived bit, simple JSON or false, sealed batch or false,
--         open batch payload or false, the sealed batch's PTTL (-1: none),
--         segment or false, the segment's PTTL}
-- A record lives in one place at a time: the simple hash, an open hash, its batch's own
-- sealed key, or (once join.lua has moved the whole batch in one atomic step) the
-- batch's slot in its segment, which the caller cuts out.
-- It only reads; malformed arguments are still refused, by name.
if not is_count(ARGV[1]) or not is_count(ARGV[2]) then
  error('get: pid `' .. tostring(ARGV[1]) .. '` or offset `' .. tostring(ARGV[2]) .. '` is not a count')
end
local index = redis.call('GETBIT', KEYS[1], ARGV[2])
local archived = redis.call('GETBIT', KEYS[2], ARGV[2])
if archived == 0 then return {index, 0, false, false, false, -1, false, -1} end
local simple = redis.call('HGET', KEYS[3], ARGV[1])
if simple then return {index, 1, simple, false, false, -1, false, -1} end
local open = redis.call('HGET', KEYS[5], ARGV[1])
if open then return {index, 1, false, false, open, -1, false, -1} end
local sealed = redis.call('GET', KEYS[4])
if sealed then return {index, 1, false, sealed, false, redis.call('PTTL', KEYS[4]), false, -1} end
return {index, 1, false, false, false, -1, redis.call('GET', KEYS[6]), redis.call('PTTL', KEYS[6])}
