-- Shared prelude, prepended to every script of the archive store after common.lua
-- (tranche-codec's; `variadic`, `in_bitmap`, `grow_bitmap` and `expect_type` are its),
-- not a script itself.
--
-- Pids and bit offsets travel as decimal strings; Lua only compares them and hands them
-- back to Redis, so values above 2^53 are never rounded.

-- Whether `v` is a decimal count (no sign, at most 18 digits): what every numeric
-- argument of these scripts must be before anything is written.
local function is_count(v)
  return type(v) == 'string' and string.match(v, '^%d+$') ~= nil and #v <= 18
end

