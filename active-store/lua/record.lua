-- Shared prelude, prepended to every script of the active store after common.lua
-- (tranche-codec's), which it builds on (not a script itself).
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
  return r and (r[1] == 'c' or r[1] == 'r') and r[3] == token or false
end

-- The same check on the raw string, without splitting it (the completion hot path):
-- the status ('c' or 'r') if the lease is held, nil otherwise. Plain finds and byte
-- reads, no pattern and no capture: half the cost of a match. `token` is an ID (no '|').
local function holds(s, token)
  if not s then return nil end
  local status, at = string.byte(s, 1, 2)
  if (status ~= 99 and status ~= 114) or at ~= 124 then return nil end
  local j = string.find(s, '|', 3, true)
  if not j or string.find(s, token, j + 1, true) ~= j + 1
    or string.byte(s, j + 1 + #token) ~= 124 then
    return nil
  end
  return status == 99 and 'c' or 'r'
end

-- A member of every lease index, scored +inf, never a pid: longer than any
-- zset-max-listpack-value, it keeps the index in the skiplist encoding. A listpack
-- inserts in O(entries) with a member comparison each (the deadlines of one claim are
-- equal), and a shard holding about as many leases as the listpack limit (128) spent 12
-- times longer in ZADD; a skiplist inserts in O(log n). It also keeps the key from
-- being deleted when the last lease goes, and so recreated as a listpack.
-- Every script runs this prelude on every call, so the member is one literal (232 '~'),
-- a constant of the compiled script: string.rep appends byte by byte (some 14,000
-- instructions a call) and a concatenation of four pieces still costs 3,000.
local SKIPLIST_KEEPER = 'tranche:skiplist-keeper:~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'

-- Checks of arguments and of what a script reads, all run before its first write:
-- Redis keeps what a failing script wrote, so a refused call must be refused before
-- anything is written. Each raises an error reply naming what was wrong.
local function refuse(what, v)
  error({err = 'ERR bad argument: ' .. what .. ' `' .. tostring(v) .. '`'})
end

-- A pid, token, bit offset, row ID or checkpoint: a canonical decimal u64 (no sign,
-- no leading zero), kept as a string (Lua numbers are doubles). Canonical, so two are
-- compared exactly by length, then bytes (`id_lt`, common.lua).
local U64_MAX = '18446744073709551615'
-- (`string.find`, not `match`: it returns positions, where `match` would build a string.)
local function is_id(v)
  return type(v) == 'string' and (v == '0' or string.find(v, '^[1-9]%d*$') ~= nil)
    and (#v < 20 or (#v == 20 and v <= U64_MAX))
end
local function id(v, what)
  if not is_id(v) then refuse(what, v) end
  return v
end
local function opt_id(v, what)
  if v ~= '' then id(v, what) end
  return v
end

-- A time in ms, a count or an attempt number: digits, exact as a Lua number (below
-- 10^15, far below 2^53). Returns the number.
local function is_num(v)
  return type(v) == 'string' and #v <= 15 and string.find(v, '^%d+$') ~= nil
end
local function num(v, what)
  if not is_num(v) then refuse(what, v) end
  return tonumber(v)
end
local function pos(v, what)
  local n = num(v, what)
  if n < 1 then refuse(what, v) end
  return n
end

-- A worker id: not empty, and without '|', a record's separator.
local function worker_id(v, what)
  if type(v) ~= 'string' or v == '' or string.find(v, '|', 1, true) then refuse(what, v) end
  return v
end

-- ARGV holds `head` arguments, then whole entries of `width` (at least one if `some`).
local function entries(head, width, some)
  local n = #ARGV - head
  if n < 0 or n % width ~= 0 or (some and n == 0) then
    refuse('argument count', #ARGV)
  end
end

-- A record read from `key` (field `pid`), decoded and checked field by field; an error
-- reply naming the key and pid when it does not decode or a field is malformed. Data
-- read back from Redis is checked like input: writing on top of a corrupt record
-- spreads the damage.
local function corrupt(key, pid, detail)
  error({err = 'ERR corrupt record ' .. key .. ' ' .. pid .. ': ' .. detail})
end
-- The shape of a sound record in one match: status, attempts, then numeric fields or
-- empty, the worker, three more, the error text. A record that matches and whose
-- numbers are short and canonical (the common case) is built from the captures at
-- once; anything else goes the field-by-field way below, which names what is wrong.
local RECORD = '^([pcrfd])|(%d+)|(%d*)|(%d*)|(%d*)|(%d*)|(%d*)|([^|]*)|(%d*)|(%d*)|(%d*)|(.*)$'
local function short(v, max) return #v <= max and (#v <= 1 or string.byte(v) ~= 48) end
-- The common case: the record built from the captures, or nil for the slow way.
local function matched(s)
  local a, b, c, d, e, f, g, h, i, j, k, l = string.match(s, RECORD)
  -- Numbers (2, 4-7) up to 15 digits, IDs (3, 9-11) up to 19: below 2^53, and below
  -- 2^64, so what the slow path accepts.
  if a and short(b, 15) and short(c, 19) and short(d, 15) and short(e, 15)
    and short(f, 15) and short(g, 15) and short(i, 19) and short(j, 19) and short(k, 19) then
    return {a, b, c, d, e, f, g, h, i, j, k, l}
  end
  return nil
end
local function checked(key, pid, s)
  local r = matched(s)
  if r then return r end
  r = decode(s)
  if r == nil then corrupt(key, pid, 'not a record `' .. s .. '`') end
  if #r[1] ~= 1 or not string.find('pcrfd', r[1], 1, true) then corrupt(key, pid, 'status `' .. r[1] .. '`') end
  if not is_num(r[2]) then corrupt(key, pid, 'attempts `' .. r[2] .. '`') end
  for _, n in ipairs({3, 9, 10, 11}) do
    if r[n] ~= '' and not is_id(r[n]) then corrupt(key, pid, 'field ' .. n .. ' `' .. r[n] .. '`') end
  end
  for n = 4, 7 do
    if r[n] ~= '' and not is_num(r[n]) then corrupt(key, pid, 'field ' .. n .. ' `' .. r[n] .. '`') end
  end
  return r
end

-- `checked` as an outcome rather than an error: the record, or nil and the error's
-- message. The scripts that act on many leases of a shard at once (heartbeat,
-- piece_beat, complete) answer a record that does not decode in its own reply slot and
-- go on with the others, writing nothing of it: one damaged record costs its own
-- partition, not every lease of its shard that shares the call.
local function checked_or(key, pid, s)
  -- A sound record (the common case) costs no pcall.
  local r = matched(s)
  if r then return r end
  local good, got = pcall(checked, key, pid, s)
  if good then return got end
  return nil, type(got) == 'table' and got.err or tostring(got)
end

-- The higher of two checkpoints (either may be empty: none recorded). A checkpoint
-- never moves backwards: a heartbeat or release carrying an older one after a newer
-- one (reordered, or retried) keeps the newer.
local function later(stored, given)
  if given == '' or (stored ~= '' and id_lt(given, stored)) then return stored end
  return given
end

-- A shard's uniform plans as {first, last, at, entry}: `read_plans` reads and checks the
-- plans list `key`, `read_cursors` each plan's cursor from the cursor hash `key` (claim
-- and discard read them before writing).
local function read_plans(key)
  local out = {}
  for i, e in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local first, last = string.match(e, '^(%d+)|(%d+)$')
    if not first or not is_num(first) or not is_num(last) or tonumber(first) > tonumber(last) then
      corrupt(key, i - 1, 'plan entry `' .. e .. '`')
    end
    out[i] = {tonumber(first), tonumber(last), 0, e, first}
  end
  return out
end
local function read_cursors(key, plans)
  for _, plan in ipairs(plans) do
    local at = redis.call('HGET', key, plan[5]) or plan[5]
    if not is_num(at) then corrupt(key, plan[5], 'cursor `' .. at .. '`') end
    plan[3] = tonumber(at)
  end
  return plans
end

-- The shard's status counters: the `counts` hash holds how many records of the active
-- hash are in each status (fields p, c, r, f, d, as field 1 of a record), so that
-- `counts()` reads five numbers instead of every record. Every script that changes a
-- status reads them first with `read_counts` (checked, before its first write), records
-- each move with `moved` and writes the sums once at its end with `count`, in the same
-- atomic step as the change itself. Field v (1) says the counters are exact: set when
-- they start from an empty active hash (`start_counting`) or are derived from the
-- records (`recount.lua`); a namespace written before the counters existed has none,
-- and the client derives them once.
-- A hot script may read only the statuses it can move (`only`, a list such as {'c', 'r'},
-- plus v when `marked` is asked for): fewer fields to fetch and check.
local COUNTED = {'p', 'c', 'r', 'f', 'd'}
local SLOT = {p = 1, c = 2, r = 3, f = 4, d = 5}
local tally = {p = 0, c = 0, r = 0, f = 0, d = 0}
local counters
local function read_counts(key, only, marked)
  local fields = only or COUNTED
  local got, at = nil, 0
  if marked or not only then
    got, at = redis.call('HMGET', key, 'v', unpack(fields)), 1
  else
    got = redis.call('HMGET', key, unpack(fields))
  end
  -- Numeric loops, not ipairs (a C call per step): these run on every hot call.
  counters = {}
  for i = 1, #fields do
    local status, v = fields[i], got[i + at]
    if v then
      if #v > 16 or not string.find(v, '^%-?%d+$') then
        corrupt(key, status, 'counter `' .. v .. '`')
      end
      counters[SLOT[status]] = tonumber(v)
    else
      counters[SLOT[status]] = 0
    end
  end
  if at == 1 then counters[6] = got[1] end
end
local function moved(from, to, n)
  n = n or 1
  if tally[from] then tally[from] = tally[from] - n end
  if tally[to] then tally[to] = tally[to] + n end
end
local function count(key)
  local args, n = {}, 0
  for i = 1, 5 do
    local status = COUNTED[i]
    local t = tally[status]
    if t ~= 0 then
      args[n + 1], args[n + 2], n = status, string.format('%d', counters[i] + t), n + 2
    end
  end
  if n == 2 then
    redis.call('HSET', key, args[1], args[2])
  elseif n > 0 then
    redis.call('HSET', key, unpack(args))
  end
end
-- Marks the counters `key` of a shard as exact (all zero) when they are not marked yet
-- and `empty()` says its active hash holds no record. The scripts that create records
-- (claim, plan_ranges) call it before they write records, so a new shard counts from its
-- first record and never needs deriving, while a shard that already held records
-- uncounted stays unmarked. `read_counts` comes first.
local function start_counting(key, empty)
  if not counters[6] and empty() then
    redis.call('HSET', key, 'p', 0, 'c', 0, 'r', 0, 'f', 0, 'v', 1)
    for i = 1, 4 do counters[i] = 0 end
    counters[6] = '1'
  end
end

-- Status reply codes shared with the client.
local OK, LOST, DUPLICATE = 1, -1, 0
