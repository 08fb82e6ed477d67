-- claim: hand out up to n partitions of one shard to a worker, in one round trip.
-- KEYS[1] active hash   KEYS[2] pending zset (score: ready time ms)   KEYS[3] leases zset
--      (score: deadline ms)   KEYS[4] plans list ("first|last" pid ranges of uniform
--      plans)   KEYS[5] cursor hash (plan first pid -> next pid to consider)
--      KEYS[6] token sequence   KEYS[7] status counters hash   KEYS[8] runs hash
-- ARGV[1] worker   ARGV[2] n   ARGV[3] now ms   ARGV[4] deadline ms   ARGV[5] shard
--      ARGV[6] num_shards   ARGV[7] partitions per batch
-- Reply: r, the number of reclaimed leases; then (pid, token, attempts, min, max,
--      progress) per reclaimed lease; then (token, first pid, count) per run of fresh
--      pids: the run's pids are first .. first + count - 1, each held under the run's
--      one token, with attempt 1, the range the client derives from the plan, and no
--      checkpoint. A run is one value in the reply, one field in the runs hash and one
--      entry in the lease index, however many pids it holds (runs.lua).
-- Writes are gathered and issued once per key (one HSET, one ZADD): a Redis command
-- called from Lua costs about as much as the work it does.
-- Every argument, and every record, plan entry, cursor and counter read, is checked
-- before the first write: a script that errors midway keeps what it wrote (Redis has no
-- rollback).
if #ARGV ~= 7 then refuse('argument count', #ARGV) end
local worker, now, deadline = worker_id(ARGV[1], 'worker'), ARGV[3], ARGV[4]
-- The six numbers in one match (the common case); when it fails, one by one, which
-- names the bad one.
if not (#ARGV[2] <= 15 and #now <= 15 and #deadline <= 15 and #ARGV[5] <= 15
    and #ARGV[6] <= 15 and #ARGV[7] <= 15 and string.find(ARGV[2] .. ' ' .. now .. ' '
      .. deadline .. ' ' .. ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7],
      '^%d+ %d+ %d+ %d+ %d+ %d+$')) then
  num(ARGV[2], 'n')
  num(now, 'now')
  num(deadline, 'deadline')
  num(ARGV[5], 'shard')
  num(ARGV[6], 'num_shards')
  num(ARGV[7], 'per batch')
end
local want, shard = tonumber(ARGV[2]), tonumber(ARGV[5])
local shards, per_batch = tonumber(ARGV[6]), tonumber(ARGV[7])
if want < 1 then refuse('n', ARGV[2]) end
if shards < 1 then refuse('num_shards', ARGV[6]) end
if per_batch < 1 then refuse('per batch', ARGV[7]) end
if shard >= shards then refuse('shard', ARGV[5]) end
-- The tokens of a call are reserved up front: a huge n would spend the sequence.
if want > MAX_CLAIM then refuse('n', ARGV[2]) end
-- Arrays are filled through explicit counters: `#t` is a search in Lua 5.1.
-- `out` is the reply: its first value, the reclaimed count, is filled in at the end.
local out, records, scores, got = {'0'}, {}, {}, 0
local no, nr, ns, reclaimed = 1, 0, 0, 0
local token

local function lease(pid, r)
  token = token + 1
  r[1] = 'c'
  r[2] = int(tonumber(r[2]) + 1)
  r[3] = int(token)
  r[4] = deadline
  r[6] = now
  r[7] = now
  r[8] = worker
  records[nr + 1], records[nr + 2], nr = pid, encode(r), nr + 2
  scores[ns + 1], scores[ns + 2], ns = deadline, pid, ns + 2
  out[no + 1], out[no + 2], out[no + 3], out[no + 4], out[no + 5], out[no + 6] = pid, r[3], r[2], r[9], r[10], r[11]
  no = no + 6
  got = got + 1
end

-- The counters first (the statuses a claim moves, and the mark): exact ones that count
-- no pending record say there is no ready work to look for.
read_counts(KEYS[7], {'p', 'c'}, true)

-- Ready retries and released partitions first: they are older work. A corrupt record
-- is refused by name, and nothing changes.
local ready = {}
if not counters[6] or counters[1] > 0 then
  ready = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, want)
end
local decoded, ndecoded = {}, 0
if #ready > 0 then
  local recs = redis.call('HMGET', KEYS[1], unpack(ready))
  for i, pid in ipairs(ready) do
    if recs[i] then
      local r = checked(KEYS[1], pid, recs[i])
      if r[1] == 'p' then
        decoded[i], ndecoded = r, ndecoded + 1
      end
    end
  end
end
-- The uniform plans and their cursors, read (and checked) only when the ready work
-- does not fill the claim.
local plans = {}
if ndecoded < want then plans = read_cursors(KEYS[5], read_plans(KEYS[4])) end

-- Whether the counters start here (`start_counting`): the active and runs hashes read
-- now, before the first write, where a key of the wrong type is refused unwritten.
local empty, runs_read = false, false
if not counters[6] and redis.call('HLEN', KEYS[1]) == 0 then
  empty, runs_read = redis.call('HLEN', KEYS[8]) == 0, true
end
-- The keys written below that nothing above has read: the lease index whenever
-- anything may be claimed, the runs hash when fresh pids may be (unless its HLEN above
-- checked it). The token sequence needs no check: it is the first key written.
if ndecoded > 0 or #plans > 0 then
  expect_type(KEYS[3], 'zset')
  if #plans > 0 and not runs_read then expect_type(KEYS[8], 'hash') end
end

-- Fresh tokens for this call, reserved up front, never below the clock's floor
-- (`reserve_tokens`, common.lua): every later call on a lease must present its token
-- (fencing). Unused ones are simply skipped.
token = reserve_tokens(KEYS[6], want)
start_counting(KEYS[7], function() return empty end)

if #ready > 0 then
  variadic('ZREM', KEYS[2], ready)
  for i, pid in ipairs(ready) do
    -- A pending entry without a pending record is stale: dropped above.
    if decoded[i] then
      lease(pid, decoded[i])
      reclaimed = reclaimed + 1
    end
  end
end

-- The smallest pid >= x whose batch belongs to this shard.
local function align(x)
  local b = math.floor(x / per_batch)
  local skip = (shard - b % shards) % shards
  if skip == 0 then return x end
  return (b + skip) * per_batch
end

-- Then fresh pids from each uniform plan's cursor: nothing is materialised before this.
-- Consecutive pids go out as one run (runs.lua): a run ends where the cursor jumps to
-- the shard's next batch, at a plan's end, or at MAX_RUN pids. Within a batch the next
-- pid is the next integer, so `align` runs only at batch boundaries.
local runs, nu = {}, 0
local format = string.format
local run_first, run_len = 0, 0
local function close_run()
  if run_len == 0 then return end
  token = token + 1
  local t, first = format('%d', token), format('%d', run_first)
  runs[nu + 1] = t
  runs[nu + 2] = first .. '|' .. format('%d', run_first + run_len - 1) .. '|' .. deadline
    .. '|' .. now .. '|' .. string.sub(FULL_MASK, 1, run_len) .. '|' .. worker
  nu = nu + 2
  scores[ns + 1], scores[ns + 2], ns = deadline, 'r' .. t, ns + 2
  out[no + 1], out[no + 2], out[no + 3], no = t, first, format('%d', run_len), no + 3
  run_len = 0
end
if got < want then
  for _, plan in ipairs(plans) do
    if got >= want then break end
    local last, at = plan[2], plan[3]
    if at <= last then
      at = align(at)
      while got < want and at <= last do
        if run_len > 0 and (at ~= run_first + run_len or run_len == MAX_RUN) then close_run() end
        if run_len == 0 then run_first = at end
        run_len = run_len + 1
        got = got + 1
        at = at + 1
        if at % per_batch == 0 then at = align(at) end
      end
      close_run()
      redis.call('HSET', KEYS[5], plan[5], int(at))
    end
  end
end

if got > 0 then
  if nr > 0 then variadic('HSET', KEYS[1], records) end
  if nu > 0 then variadic('HSET', KEYS[8], runs) end
  scores[ns + 1], scores[ns + 2], ns = '+inf', SKIPLIST_KEEPER, ns + 2
  variadic('ZADD', KEYS[3], scores)
  -- Reclaimed partitions move from pending; fresh ones were not counted before.
  moved(nil, 'c', got)
  moved('p', nil, reclaimed)
  count(KEYS[7])
end
out[1] = int(reclaimed)
return out
