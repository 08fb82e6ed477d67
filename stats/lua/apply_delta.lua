-- apply_delta: a fragment, not a script. It defines `apply_stats` for a script that
-- concatenates this source in front of its own (the archiver's, so that statistics
-- change in the same atomic step as the archive write) and calls it.
--
-- apply_stats(k, a) applies one shard's statistics delta:
--   KEYS[k]     {ns:s}:stats:global    KEYS[k + 1] {ns:s}:stats:workers
--   KEYS[k + 2] {ns:s}:stats:ranges    KEYS[k + 3] {ns:s}:stats:hourly
--   KEYS[k + 4] {ns:s}:stats:hist      (the order of stats_keys; all of one shard)
--   ARGV[a]     n, the number of delta arguments in ARGV[a + 1 .. a + n]
--   Returns a + n + 1, the index of the first ARGV after the delta.
-- The delta arguments (delta_args in Rust), every number a decimal string:
--   now_ms count ids dur_ms first_ms last_ms
--   nw, then nw times: worker count ids dur_ms
--   nr, then nr times: r count dur_ms min_id max_id first_ms last_ms nrw,
--       then nrw times: worker count dur_ms ids
--   nh, then nh times: 'YYYY-MM-DD|HH' count
--   nb, then nb times: '*|bucket' or 'worker|bucket' count
-- n = 0 is an empty delta and writes nothing.
--
-- A caller may skip a delta without applying it: the next argument is ARGV[a + n + 1].
--
-- Exactly-once is the caller's job: apply a delta only for records it has not applied
-- before (the archive's per-pid archived bit). Counters are HINCRBY, so int64; Redis
-- does not undo a script's writes when a later command fails, so before writing
-- anything apply_stats raises an error if a global counter of the shard or of the
-- delta has reached 10^18 (then no sum can pass 2^63 - 1, as every other counter is at
-- most its global one). Call it before your own writes to keep that guarantee whole.
-- Row IDs and times are never
-- turned into Lua numbers (doubles, exact only below 2^53): min/max/first/last compare
-- decimal strings by length, then bytewise. Only list lengths go through tonumber.
-- The work is per field of the delta, never per record: a batch of a hundred records
-- of one worker in one range costs about twenty commands.

-- Whether decimal x < decimal y (no signs, no leading zeros).
local function stats_less(x, y)
  if #x ~= #y then return #x < #y end
  return x < y
end

-- HMGET/HSET over long lists in chunks: Lua's unpack is bounded.
local function stats_hmget(key, fields)
  local out, n = {}, 0
  for from = 1, #fields, 4000 do
    local part = redis.call('HMGET', key, unpack(fields, from, math.min(from + 3999, #fields)))
    for j = 1, #part do out[n + j] = part[j] end
    n = n + #part
  end
  return out
end

local function stats_hset(key, list)
  for from = 1, #list, 4000 do
    redis.call('HSET', key, unpack(list, from, math.min(from + 3999, #list)))
  end
end

local function apply_stats(k, a)
  local n = tonumber(ARGV[a])
  if n == 0 then return a + 1 end
  local i = a + 1
  local function nxt()
    local v = ARGV[i]
    i = i + 1
    return v
  end

  -- Global counters, and the completion-time bounds and update time as maxima/minima.
  local now, count, ids, dur, first, last = nxt(), nxt(), nxt(), nxt(), nxt(), nxt()
  local cur = redis.call('HMGET', KEYS[k], 'count', 'ids', 'dur_sum_ms',
    'first_completed_ms', 'last_completed_ms', 'updated_ms')
  -- The overflow guard, before any write (see the header).
  for j = 1, 3 do
    if cur[j] and #cur[j] > 18 then
      error('stats: a counter of ' .. KEYS[k] .. ' reached 10^18; nothing was applied')
    end
  end
  if #count > 18 or #ids > 18 or #dur > 18 then
    error('stats: a delta counter reached 10^18; nothing was applied')
  end
  redis.call('HINCRBY', KEYS[k], 'count', count)
  if ids ~= '0' then redis.call('HINCRBY', KEYS[k], 'ids', ids) end
  if dur ~= '0' then redis.call('HINCRBY', KEYS[k], 'dur_sum_ms', dur) end
  local set = {}
  if not cur[4] or stats_less(first, cur[4]) then
    set[#set + 1], set[#set + 2] = 'first_completed_ms', first
  end
  if not cur[5] or stats_less(cur[5], last) then
    set[#set + 1], set[#set + 2] = 'last_completed_ms', last
  end
  if not cur[6] or stats_less(cur[6], now) then
    set[#set + 1], set[#set + 2] = 'updated_ms', now
  end
  if #set > 0 then redis.call('HSET', KEYS[k], unpack(set)) end

  -- Per worker.
  for _ = 1, tonumber(nxt()) do
    local w, c, wi, wd = nxt(), nxt(), nxt(), nxt()
    redis.call('HINCRBY', KEYS[k + 1], w .. '|count', c)
    if wi ~= '0' then redis.call('HINCRBY', KEYS[k + 1], w .. '|ids', wi) end
    if wd ~= '0' then redis.call('HINCRBY', KEYS[k + 1], w .. '|dur', wd) end
  end

  -- Per 100,000-ID range: counters now, bounds after one HMGET for all ranges.
  local fields, wants = {}, {}
  for _ = 1, tonumber(nxt()) do
    local r, c, d = nxt(), nxt(), nxt()
    redis.call('HINCRBY', KEYS[k + 2], r .. '|count', c)
    if d ~= '0' then redis.call('HINCRBY', KEYS[k + 2], r .. '|dur', d) end
    local nf = #fields
    fields[nf + 1], fields[nf + 2], fields[nf + 3], fields[nf + 4] =
      r .. '|min', r .. '|max', r .. '|first', r .. '|last'
    wants[nf + 1], wants[nf + 2], wants[nf + 3], wants[nf + 4] = nxt(), nxt(), nxt(), nxt()
    for _ = 1, tonumber(nxt()) do
      local w, wc, wd, wi = nxt(), nxt(), nxt(), nxt()
      local f = r .. '|w|' .. w .. '|'
      redis.call('HINCRBY', KEYS[k + 2], f .. 'count', wc)
      if wd ~= '0' then redis.call('HINCRBY', KEYS[k + 2], f .. 'dur', wd) end
      if wi ~= '0' then redis.call('HINCRBY', KEYS[k + 2], f .. 'ids', wi) end
    end
  end
  if #fields > 0 then
    local have = stats_hmget(KEYS[k + 2], fields)
    local upd = {}
    for j = 1, #fields do
      -- Fields cycle min, max, first, last: the 1st and 3rd keep the least value.
      local low = (j % 4 == 1) or (j % 4 == 3)
      local h, w = have[j], wants[j]
      if not h or (low and stats_less(w, h)) or (not low and stats_less(h, w)) then
        upd[#upd + 1], upd[#upd + 2] = fields[j], w
      end
    end
    if #upd > 0 then stats_hset(KEYS[k + 2], upd) end
  end

  -- Hourly completions, then duration histogram buckets.
  for _ = 1, tonumber(nxt()) do
    local f, c = nxt(), nxt()
    redis.call('HINCRBY', KEYS[k + 3], f, c)
  end
  for _ = 1, tonumber(nxt()) do
    local f, c = nxt(), nxt()
    redis.call('HINCRBY', KEYS[k + 4], f, c)
  end
  return a + n + 1
end
