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

-- The same check on the raw string, without splitting it (the completion hot path):
-- the status ('c' or 'r') if the lease is held, nil otherwise.
local function holds(s, token)
  if not s then return nil end
  local status, t = string.match(s, '^([cr])|[^|]*|([^|]*)|')
  if status ~= nil and t == token then return status end
  return nil
end

-- A member of every lease index, scored +inf, never a pid: longer than any
-- zset-max-listpack-value, it keeps the index in the skiplist encoding. A listpack
-- inserts in O(entries) with a member comparison each (the deadlines of one claim are
-- equal), and a shard holding about as many leases as the listpack limit (128) spent 12
-- times longer in ZADD; a skiplist inserts in O(log n). It also keeps the key from
-- being deleted when the last lease goes, and so recreated as a listpack.
local SKIPLIST_KEEPER = 'tranche:skiplist-keeper:' .. string.rep('~', 232)

-- Arguments for one variadic command: redis.call(cmd, key, unpack(list)) in chunks, as
-- Lua's unpack is limited to a few thousand values.
local function variadic(cmd, key, list)
  for i = 1, #list, 4000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
  end
end

-- The shard's status counters: the `counts` hash holds how many records of the active
-- hash are in each status (fields p, c, r, f, d, as field 1 of a record), so that
-- `counts()` reads five numbers instead of every record. Every script that changes a
-- status records the move with `moved` and applies the sum once at its end with `count`,
-- in the same atomic step as the change itself. Field v (1) says the counters are exact:
-- set when they start from an empty active hash (`start_counting`) or are derived from
-- the records (`recount.lua`); a namespace written before the counters existed has none,
-- and the client derives them once.
local tally = {p = 0, c = 0, r = 0, f = 0, d = 0}
local function moved(from, to, n)
  n = n or 1
  if tally[from] then tally[from] = tally[from] - n end
  if tally[to] then tally[to] = tally[to] + n end
end
local function count(key)
  for _, status in ipairs({'p', 'c', 'r', 'f', 'd'}) do
    if tally[status] ~= 0 then redis.call('HINCRBY', key, status, tally[status]) end
  end
end
-- Marks the counters `key` of a shard as exact (all zero) when they are not marked yet
-- and `empty()` says its active hash holds no record. The scripts that create records
-- (claim, plan_ranges) call it before they write, so a new shard counts from its first
-- record and never needs deriving, while a shard that already held records uncounted
-- stays unmarked.
local function start_counting(key, empty)
  if redis.call('HEXISTS', key, 'v') == 0 and empty() then
    redis.call('HSET', key, 'p', 0, 'c', 0, 'r', 0, 'f', 0, 'v', 1)
  end
end

-- Status reply codes shared with the client.
local OK, LOST, DUPLICATE = 1, -1, 0
