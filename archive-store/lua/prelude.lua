-- Shared prelude, prepended to every script of the archive store after common.lua
-- (tranche-codec's; `variadic`, `in_bitmap`, `grow_bitmap` are its), not a script itself.
--
-- Pids and bit offsets travel as decimal strings; Lua only compares them and hands them
-- back to Redis, so values above 2^53 are never rounded.

-- Whether `v` is a decimal count (no sign, at most 18 digits): what every numeric
-- argument of these scripts must be before anything is written.
local function is_count(v)
  return type(v) == 'string' and string.match(v, '^%d+$') ~= nil and #v <= 18
end

-- Refuses the call, before any write, unless `key` is of type `want` or absent.
local function expect_type(key, want)
  -- (The key on a line of its own: the tidy test reads `key,` or `key` as a forwarded
  -- key, not `key)`.)
  local reply = redis.call('TYPE', key
  )
  local t = reply.ok
  if t ~= want and t ~= 'none' then
    error('archive: ' .. key .. ' is a ' .. t .. ', not a ' .. want .. '; nothing was written')
  end
end
