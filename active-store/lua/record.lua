-- Shared prelude, prepended to every script of the active store (not a script itself).
--
-- A partition in the shard's `active` hash is one string of twelve '|'-separated fields:
--   1 status (p pending, c claimed, r running, f failed)   2 attempts   3 lease token
--   4 lease deadline (ms)   5 created (ms)   6 claimed (ms)   7 updated (ms)
--   8 worker id   9 min id   10 max id   11 progress (checkpoint id)   12 last error
-- Row IDs and checkpoints are opaque decimal strings here: Lua numbers are doubles and
-- would round IDs above 2^53. Empty min/max mean "derived from the uniform plan", which
-- the client knows. The error is last so that it may itself contain '|'.
-- Lua only does arithmetic on pids, attempts and millisecond times, all far below 2^53.

local function decode(s)
  local r, i = {}, 1
  for n = 1, 11 do
    local j = string.find(s, '|', i, true)
    if not j then return nil end
    r[n] = string.sub(s, i, j - 1)
    i = j + 1
  end
  r[12] = string.sub(s, i)
  return r
end

local function encode(r)
  return table.concat(r, '|', 1, 12)
end

-- Integers formatted without an exponent (tostring would print 1e+15). '%d' goes through
-- a C long, exact below 2^63, and is several times cheaper than '%.0f'.
local function int(x)
  return string.format('%d', x)
end

-- A lease is held by (pid, token) only while the record is claimed or running with that
-- token. This is the fencing check: a worker whose lease was reaped and handed to
-- another gets `lease lost`, never a silent overwrite of the new holder's state.
local function leased(r, token)
  return r ~= nil and (r[1] == 'c' or r[1] == 'r') and r[3] == token
end

-- The same check on the raw string, without splitting it (the completion hot path).
local function holds(s, token)
  if not s then return false end
  local status, t = string.match(s, '^([cr])|[^|]*|([^|]*)|')
  return status ~= nil and t == token
end

-- Arguments for one variadic command: redis.call(cmd, key, unpack(list)) in chunks, as
-- Lua's unpack is limited to a few thousand values.
local function variadic(cmd, key, list)
  for i = 1, #list, 4000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
  end
end

-- Status reply codes shared with the client.
local OK, LOST, DUPLICATE = 1, -1, 0
