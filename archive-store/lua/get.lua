-- get: everything the archive knows about one pid, in one round trip.
-- KEYS[1] completed index bitmap (set by the active store)   KEYS[2] archived bitmap
--      KEYS[3] simple-tier hash   KEYS[4] sealed batch string   KEYS[5] open batch hash
-- ARGV[1] pid   ARGV[2] bit offset
-- Reply: {index bit, archived bit, simple JSON or false, sealed batch or false,
--         open batch payload or false, the sealed batch's PTTL (-1: none)}
local index = redis.call('GETBIT', KEYS[1], ARGV[2])
local archived = redis.call('GETBIT', KEYS[2], ARGV[2])
if archived == 0 then return {index, 0, false, false, false, -1} end
local simple = redis.call('HGET', KEYS[3], ARGV[1])
if simple then return {index, 1, simple, false, false, -1} end
local open = redis.call('HGET', KEYS[5], ARGV[1])
if open then return {index, 1, false, false, open, -1} end
return {index, 1, false, redis.call('GET', KEYS[4]), false, redis.call('PTTL', KEYS[4])}
