-- Shared prelude, prepended to every script of the archive store (not a script itself).
--
-- Pids and bit offsets travel as decimal strings; Lua only compares them and hands them
-- back to Redis, so values above 2^53 are never rounded.

-- Runs `cmd key list...` in chunks, so a long list never exceeds Lua's unpack limit.
local function variadic(cmd, key, list, step)
  step = step or 1000
  for i = 1, #list, step do
    redis.call(cmd, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
end
