-- carve: move pids out of their runs (runs.lua) into records of their own, each the
-- record its run stood for, with its own lease entry at the run's deadline. Every
-- script but claim, complete and heartbeat acts only on records: the client carves the
-- pids it is about to name (or a whole worker's, or the expired runs) before it calls
-- one. Carving changes how a pid is held, never what is held: its status, token,
-- deadline and worker stay, so it may run at any time, any number of times.
-- KEYS[1] runs hash   KEYS[2] active hash   KEYS[3] leases zset
-- ARGV[1] which: 'pids' (then ARGV[2] how many, and that many pids), 'worker'
--      (ARGV[2]: every pid of that worker's runs), 'expired' (ARGV[2] now ms: every
--      pid of a run whose lease index entry is due at or before it, as reap.lua reads
--      it), 'all', or 'broken' (ARGV[2] a token, ARGV[3] the shard, ARGV[4] num_shards,
--      ARGV[5] partitions per batch; KEYS[4] plans list, KEYS[5] cursor hash: the run of
--      that token, if it does not decode, becomes a record per pid it may have held,
--      each the text 'broken run' and the raw value, which decodes as no record:
--      repair.lua then sets each aside and rebuilds it; the run and its lease entry go.
--      One whose first and last fields do not read is left as it is: what it holds is
--      unknown, and dropping it would lose its pids)
-- Reply: the number of pids carved; for 'broken', the pids broken up.
-- A run that does not decode is left as it is (`check` lists it); a pid that already has
-- a record keeps it (it left its run for good). Every argument and every run used is
-- checked before the first write.
if #ARGV < 1 then refuse('argument count', #ARGV) end
local which = ARGV[1]
local want, worker, tokens = nil, nil, nil
if which == 'pids' then
  if #ARGV < 3 or pos(ARGV[2], 'count') ~= #ARGV - 2 then refuse('argument count', #ARGV) end
  want = {}
  for i = 3, #ARGV do want[tonumber(id(ARGV[i], 'pid'))] = true end
elseif which == 'worker' then
  if #ARGV ~= 2 then refuse('argument count', #ARGV) end
  worker = worker_id(ARGV[2], 'worker')
elseif which == 'expired' then
  if #ARGV ~= 2 then refuse('argument count', #ARGV) end
  num(ARGV[2], 'now')
  tokens = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[2])) do
    if string.byte(m, 1) == 114 then tokens[#tokens + 1] = string.sub(m, 2) end
  end
elseif which == 'all' then
  if #ARGV ~= 1 then refuse('argument count', #ARGV) end
elseif which == 'broken' then
  if #ARGV ~= 5 then refuse('argument count', #ARGV) end
  local t = id(ARGV[2], 'token')
  local shard, shards, per_batch = num(ARGV[3], 'shard'), pos(ARGV[4], 'num_shards'),
    pos(ARGV[5], 'per batch')
  if shard >= shards then refuse('shard', ARGV[3]) end
  local raw = redis.call('HGET', KEYS[1], t)
  if not raw or run_decode_or(KEYS[1], t, raw) then return {} end
  -- The pids it may have held. Its first and last fields may be the damaged ones: with
  -- its mask still of a readable length, the spans that length gives from either end
  -- count too, so one damaged number loses no pid. Of those, only the pids this shard
  -- issued (below its plan's cursor) and no sound run holds: a wrong number must not
  -- make a pid not issued yet pending (the cursor would issue it again), nor one a
  -- live run holds (it would be held twice). A pid with a record keeps it, below.
  local first, last = string.match(raw, '^(%d+)|(%d+)|')
  if not (first and #first <= 15 and #last <= 15 and tonumber(last) >= tonumber(first)
      and tonumber(last) - tonumber(first) < MAX_RUN) then
    return {}
  end
  local lo, hi = tonumber(first), tonumber(last)
  local mask = string.match(raw, '^%d+|%d+|[^|]*|[^|]*|([^|]*)|')
  if mask and #mask >= 1 and #mask <= MAX_RUN then
    lo, hi = math.min(lo, hi - #mask + 1), math.max(hi, lo + #mask - 1)
  end
  local plans = read_cursors(KEYS[5], read_plans(KEYS[4]))
  local held, all = {}, redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local u = run_decode_or(KEYS[1], all[i], all[i + 1])
    if u then
      for k = 1, #u[5] do
        if string.byte(u[5], k) == 99 then held[u[7] + k - 1] = true end
      end
    end
  end
  local names, n = {}, 0
  for pid = math.max(lo, 1), hi do
    local issued = false
    for _, plan in ipairs(plans) do
      if pid >= plan[1] and pid <= plan[2] and pid < plan[3] then issued = true end
    end
    if issued and not held[pid] and math.floor(pid / per_batch) % shards == shard then
      n = n + 1
      names[n] = string.format('%d', pid)
    end
  end
  if n == 0 then return {} end
  local broken, nb = {}, 0
  local have = redis.call('HMGET', KEYS[2], unpack(names))
  for i = 1, n do
    if not have[i] then
      broken[nb + 1], broken[nb + 2], nb = names[i], 'broken run ' .. t .. ': ' .. raw, nb + 2
    end
  end
  -- The lease index, which nothing here reads, is written first: a key of the wrong type
  -- there is refused by that write alone (the runs and active hashes were read above).
  redis.call('ZREM', KEYS[3], 'r' .. t)
  if nb > 0 then variadic('HSET', KEYS[2], broken) end
  redis.call('HDEL', KEYS[1], t)
  local out = {}
  for i = 1, nb, 2 do out[#out + 1] = broken[i] end
  return out
else
  refuse('which', which)
end

-- The runs to look at, as (token, value) pairs.
local pairs_ = {}
if tokens then
  if #tokens > 0 then
    local raw = redis.call('HMGET', KEYS[1], unpack(tokens))
    for i, t in ipairs(tokens) do
      if raw[i] then
        pairs_[#pairs_ + 1] = t
        pairs_[#pairs_ + 1] = raw[i]
      end
    end
  end
else
  pairs_ = redis.call('HGETALL', KEYS[1])
end

-- What to carve, decided before any write: (pid, record, deadline) per pid.
local touched, carved, nc, any = {}, {}, 0, false
for i = 1, #pairs_, 2 do
  local t = pairs_[i]
  local u = run_decode_or(KEYS[1], t, pairs_[i + 1])
  if u and (not worker or u[6] == worker) then
    local mask = u[5]
    for k = 1, #mask do
      if string.byte(mask, k) == 99 then
        local pid = u[7] + k - 1
        if not want or want[pid] then
          run_leave(u, k)
          touched[t], any = u, true
          nc = nc + 1
          carved[nc] = {string.format('%d', pid), run_record(u, t), u[3]}
        end
      end
    end
  end
end
if not any then return 0 end

-- A pid with a record of its own already keeps it.
local names = {}
for i = 1, nc do names[i] = carved[i][1] end
local have = redis.call('HMGET', KEYS[2], unpack(names))
local records, scores, nr, ns = {}, {}, 0, 0
for i = 1, nc do
  if not have[i] then
    records[nr + 1], records[nr + 2], nr = carved[i][1], carved[i][2], nr + 2
    scores[ns + 1], scores[ns + 2], ns = carved[i][3], carved[i][1], ns + 2
  end
end
-- A key of the wrong type is refused before the first write: the runs and active
-- hashes were read above, and the lease index (read only for 'expired') is written
-- first when a pid gets a record, else checked.
if nr > 0 then
  variadic('ZADD', KEYS[3], scores)
  variadic('HSET', KEYS[2], records)
elseif not tokens then
  expect_type(KEYS[3], 'zset')
end
variadic('ZREM', KEYS[3], runs_store(KEYS[1], touched))
return nc
