-- Runs prelude, prepended (after record.lua) to the scripts that meet interval leases:
-- claim, complete, heartbeat and carve. Not a script itself.
--
-- A claim hands out the fresh pids of a uniform plan's cursor in runs of consecutive
-- pids, each run one lease: one field of the shard's `runs` hash, named by the run's
-- fencing token (every pid of the run presents it), and one member of the lease index,
-- 'r' .. token, scored by the deadline. The value is six '|'-separated fields:
--   1 first pid   2 last pid   3 deadline (ms)   4 claimed at (ms)
--   5 mask: one character per pid of first..last, 'c' while the run holds the pid, '.'
--   once it left (completed, or carved out)   6 worker
-- A pid the run holds stands for the record a fresh claim writes, `c|1|token|deadline|
-- claimed|claimed|claimed|worker||||` (record.lua), and reads as it everywhere. Only
-- claim, complete, heartbeat and carve know runs: a beat moves its pid out of its run,
-- found by the beat's token, into that record of its own with its own lease entry;
-- every other script acts on a pid only after carve.lua made that move (the client
-- carves before it calls them). A pid leaves
-- its run once, and never returns: a run only shrinks, and goes when its mask holds no
-- 'c' (its field and its lease entry together).

-- MAX_RUN, the most pids to a run, and the masks FULL_MASK (MAX_RUN 'c') and EMPTY_MASK
-- (MAX_RUN '.', what a mask slice becomes once its pids left: complete.lua's groups)
-- are written in front of this prelude from their Rust definition: a new run's mask is
-- cut from the literal (a constant of the compiled script; string.rep appends byte by
-- byte).

-- A run value decoded and checked: {first, last, deadline, claimed, mask, worker, the
-- first pid as a number}; or nil and an error naming the key and token when it is not
-- one (`checked_or`'s outcome for records, record.lua, without its pcall). complete and
-- heartbeat answer the pids of a run that does not decode in their own reply slots and
-- go on with the rest of the call, writing nothing of it: one damaged run costs its own
-- leases, not every lease of its shard that shares the call; carve passes it by (but
-- for its 'broken' mode, which breaks it up).
local RUN = '^(%d+)|(%d+)|(%d+)|(%d+)|([c.]+)|([^|]+)$'
local function run_decode_or(key, token, s)
  local first, last, deadline, claimed, mask, worker = string.match(s, RUN)
  local why
  if not (first and short(first, 15) and short(last, 15) and short(deadline, 15)
      and short(claimed, 15)) then
    why = 'not a run `'
  elseif tonumber(last) - tonumber(first) + 1 ~= #mask then
    why = 'run mask of the wrong length `'
  else
    return {first, last, deadline, claimed, mask, worker, tonumber(first)}
  end
  return nil, 'ERR corrupt run ' .. key .. ' ' .. token .. ': ' .. why .. s .. '`'
end

local function run_encode(u)
  return u[1] .. '|' .. u[2] .. '|' .. u[3] .. '|' .. u[4] .. '|' .. u[5] .. '|' .. u[6]
end

-- The position of `pid` (a number) in run `u` if the run still holds it, else nil.
local function run_holds(u, pid)
  local k = pid - u[7] + 1
  if k >= 1 and k <= #u[5] and string.byte(u[5], k) == 99 then return k end
  return nil
end

-- Marks position `k` of run `u` as left.
local function run_leave(u, k)
  u[5] = string.sub(u[5], 1, k - 1) .. '.' .. string.sub(u[5], k + 1)
end

-- The record a pid held by run `u` under `token` stands for.
local function run_record(u, token)
  return 'c|1|' .. token .. '|' .. u[3] .. '|' .. u[4] .. '|' .. u[4] .. '|' .. u[4] .. '|'
    .. u[6] .. '||||'
end

-- Writes the runs in `touched` (token -> run) back to the runs hash `key` after they
-- lost pids: a run with a pid left is rewritten, an empty one goes. Returns the lease
-- index entries of the runs gone, for the caller to remove.
local function runs_store(key, touched)
  local keep, gone, members, nk, ng = {}, {}, {}, 0, 0
  for token, u in pairs(touched) do
    if string.find(u[5], 'c', 1, true) then
      keep[nk + 1], keep[nk + 2], nk = token, run_encode(u), nk + 2
    else
      ng = ng + 1
      gone[ng], members[ng] = token, 'r' .. token
    end
  end
  if nk > 0 then variadic('HSET', key, keep) end
  if ng > 0 then variadic('HDEL', key, gone) end
  return members
end
