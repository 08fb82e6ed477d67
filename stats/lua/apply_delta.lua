-- apply_delta: a fragment, not a script. It defines `apply_stats` for a script that
-- composes this source in front of its own (the archiver's, so that statistics
-- change in the same atomic step as the archive write) and calls it. It reads
-- common.lua (tranche-codec's: `id_lt`) and STATS_RANGE, the IDs of one range
-- (RANGE_SIZE in Rust), written in front of it.
--
-- apply_stats is `stats_plan` then `stats_write`: stats_plan(k, a) reads, checks and
-- computes everything and writes nothing, returning the writes and the index after
-- the delta; stats_write(writes) issues them. stats_plan is three steps: stats_decode
-- (the arguments, checked), stats_check (the stored values the delta touches, read
-- and checked) and stats_compute (the writes). A script with writes of its own plans
-- first, before its first write, and issues the statistics' writes with its own.
--
-- apply_stats(k, a, packed) applies one shard's statistics delta (packed: write the
-- ranges it touches as packed bodies, below; readers before archive format 3 refuse
-- them):
--   KEYS[k]     {ns:s}:stats:global    KEYS[k + 1] {ns:s}:stats:workers
--   KEYS[k + 2] {ns:s}:stats:ranges    KEYS[k + 3] {ns:s}:stats:hourly
--   KEYS[k + 4] {ns:s}:stats:hist      (the order of stats_keys; all of one shard)
--   ARGV[a]     n, the number of delta arguments in ARGV[a + 1 .. a + n]
--   Returns a + n + 1, the index of the first ARGV after the delta.
-- The delta arguments (delta_args in Rust), every number a decimal string:
--   now_ms count ids dur_ms first_ms last_ms
--   nw, then nw times: worker count ids dur_ms
--   nb, then nb times: block nr, then nr times (ascending slot):
--       slot min_rel max_rel first_ms last_ms nrw, then nrw times: wpos count dur_ms ids
--       (range r = 64 * block + slot; min_rel/max_rel are min_id/max_id - STATS_RANGE * r;
--       wpos is the worker's position, from 1, in the worker list above)
--   nd, then nd times: 'YYYY-MM-DD' nh, then nh times: hour count
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
--
-- Packed values (the ranges and hourly hashes; Rust's packed.rs reads them):
-- * Worker palette: every worker of the shard has a small index, `{worker}|idx` in the
--   workers hash, allocated from the global field `palette` (the next index).
-- * Ranges: one field per block of 64 ranges, the block number; its value is
--   varint(base_ms) then, by ascending slot, entries `slot(1 byte) varint(len) body`.
--   base_ms is the first completion time of the block's first write (0 if too large);
--   it only makes the offsets small and is never changed, so bytes may depend on
--   arrival order while every value they decode to does not.
--   A compact body: flags(1 byte: 2 seconds, 4 unit, 8 bitmap) varint(min_rel)
--   zz(max_rel - STATS_RANGE) zz((first - base) / k) varint((last - first) / k) [varint(U)]
--   workers (bitmap: varint(L) then L bytes, bit j of byte i = index 8i + j; or a list:
--   varint(count) then the ascending indexes), then per worker by ascending index:
--   varint(count) varint(dur / k) [varint(ids)]. k is 1000 when flag 2 is set (every
--   time offset and duration a whole second). With flag 4 every worker's ids equal
--   count * U, and U is written once instead. The range's count and summed duration are
--   the sums over its workers. zz is the zigzag code (x >= 0: 2x, x < 0: -2x - 1).
--   A packed body (flag 16, written only when the caller asks: archive format 3) is a
--   compact body whose workers' counts and durations are two bit-packed columns: after
--   the workers, varint(cbase) varint(cw) varint(dbase) varint(dw), then per worker by
--   ascending index (count - cbase) in cw bits and (dur / k - dbase) in dw bits, least
--   significant bit first, the last byte padded with zero bits; then, without flag 4,
--   varint(ids) per worker. Two more flags only go with 16: 32, the range is whole
--   (min_rel 1 and max_rel STATS_RANGE, both left out), and 64 (with 4), U is left out as
--   (max_rel - min_rel + 1) / count, which it equals exactly.
--   A wide body (flags 1), when some number is 10^15 or more: decimal strings
--   `varint(len) digits` of min_rel max_rel first last nw, then per worker
--   idx count dur ids.
-- * Hourly: one field per UTC day 'YYYY-MM-DD': a byte 0 and 24 varint counts, or a
--   byte 1 and 24 decimal strings as above.
-- Numbers below 10^15 are Lua numbers (exact: doubles hold integers to 2^53); larger
-- ones stay decimal strings, added digit by digit, compared by length then bytewise.
-- Row IDs only reach Lua as offsets within their range.
-- The work is per field of the delta, never per record: a batch of a thousand records
-- of eight workers over ten ranges rewrites one or two block values.

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

local STATS_BIG = 1e15

-- A decimal string as a number (below 10^15) or the string itself.
local function stats_num(s)
  if #s <= 15 then return tonumber(s) end
  return s
end

local function stats_dec(x)
  if type(x) == 'string' then return x end
  return string.format('%.0f', x)
end

local function stats_lt(x, y)
  if type(x) == 'number' and type(y) == 'number' then return x < y end
  return id_lt(stats_dec(x), stats_dec(y))
end

local function stats_add(x, y)
  if type(x) == 'number' and type(y) == 'number' then
    local s = x + y
    if s < STATS_BIG then return s end
    return stats_dec(s)
  end
  local a, b = stats_dec(x), stats_dec(y)
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48; i = i - 1 end
    if j > 0 then d = d + string.byte(b, j) - 48; j = j - 1 end
    if d >= 10 then d, carry = d - 10, 1 else carry = 0 end
    out[#out + 1] = d
  end
  local digits = {}
  for m = #out, 1, -1 do digits[#digits + 1] = out[m] end
  return stats_num(table.concat(digits))
end

-- Varints (LEB128) of numbers below 2^53, appended to a byte list.
local function stats_put(bytes, x)
  while x >= 128 do
    local b = x % 128
    bytes[#bytes + 1] = b + 128
    x = (x - b) / 128
  end
  bytes[#bytes + 1] = x
end

local function stats_get(s, p)
  local x, m = 0, 1
  while true do
    local b = string.byte(s, p)
    if not b or m > 2 ^ 49 then error('stats: a packed statistics value is corrupt') end
    p = p + 1
    if b < 128 then return x + b * m, p end
    x = x + (b - 128) * m
    m = m * 128
  end
end

local function stats_putdec(bytes, x)
  local s = stats_dec(x)
  stats_put(bytes, #s)
  for m = 1, #s do bytes[#bytes + 1] = string.byte(s, m) end
end

local function stats_getdec(s, p)
  local len
  len, p = stats_get(s, p)
  return stats_num(string.sub(s, p, p + len - 1)), p + len
end

local function stats_zz(x)
  if x >= 0 then return 2 * x end
  return -2 * x - 1
end

local function stats_unzz(z)
  if z % 2 == 0 then return z / 2 end
  return -(z + 1) / 2
end

-- Bytes as a string, in pieces: Lua's unpack is bounded.
local function stats_chars(bytes)
  local parts = {}
  for from = 1, #bytes, 4000 do
    parts[#parts + 1] = string.char(unpack(bytes, from, math.min(from + 3999, #bytes)))
  end
  return table.concat(parts)
end

-- The number of bits of x (0 for 0), x below 2^53.
local function stats_width(x)
  local w = 0
  while x >= 1 do
    x = (x - x % 2) / 2
    w = w + 1
  end
  return w
end

-- Appends x (below 2^w) in w bits to bit writer b = {bytes, cur, used}, least
-- significant bit first; stats_flushbits pads the last byte.
local function stats_putbits(b, x, w)
  while w > 0 do
    local take = math.min(w, 8 - b.used)
    local scale = 2 ^ take
    local chunk = x % scale
    b.cur = b.cur + chunk * 2 ^ b.used
    x = (x - chunk) / scale
    w = w - take
    b.used = b.used + take
    if b.used == 8 then
      b.bytes[#b.bytes + 1] = b.cur
      b.cur, b.used = 0, 0
    end
  end
end

local function stats_flushbits(b)
  if b.used > 0 then b.bytes[#b.bytes + 1] = b.cur end
  b.cur, b.used = 0, 0
end

-- Reads w bits from bit reader b = {s, p, off} (stats_putbits' order).
local function stats_getbits(b, w)
  local x, scale = 0, 1
  while w > 0 do
    local byte = string.byte(b.s, b.p)
    if not byte then error('stats: a packed statistics value is corrupt') end
    local take = math.min(w, 8 - b.off)
    local part = math.floor(byte / 2 ^ b.off) % 2 ^ take
    x = x + part * scale
    scale = scale * 2 ^ take
    w = w - take
    b.off = b.off + take
    if b.off == 8 then b.p, b.off = b.p + 1, 0 end
  end
  return x
end

-- A range body (string s, bytes p..e) as {mn, mx, f, l, w = {[idx] = {c, d, i}}}.
local function stats_decode_range(s, p, base)
  local flags = string.byte(s, p)
  p = p + 1
  local r = {w = {}}
  if flags == 1 then
    local nw
    r.mn, p = stats_getdec(s, p)
    r.mx, p = stats_getdec(s, p)
    r.f, p = stats_getdec(s, p)
    r.l, p = stats_getdec(s, p)
    nw, p = stats_getdec(s, p)
    for _ = 1, nw do
      local idx, c, d, i
      idx, p = stats_getdec(s, p)
      c, p = stats_getdec(s, p)
      d, p = stats_getdec(s, p)
      i, p = stats_getdec(s, p)
      r.w[idx] = {c, d, i}
    end
    return r
  end
  local k = 1
  if flags % 4 >= 2 then k = 1000 end
  local unit = flags % 8 >= 4
  local packed, whole, implied = flags % 32 >= 16, flags % 64 >= 32, flags % 128 >= 64
  if flags >= 128 or flags % 2 == 1 or (not packed and (whole or implied))
      or (implied and not unit) then
    error('stats: a packed statistics value is corrupt')
  end
  local v
  if whole then
    r.mn, r.mx = 1, STATS_RANGE
  else
    r.mn, p = stats_get(s, p)
    v, p = stats_get(s, p)
    r.mx = STATS_RANGE + stats_unzz(v)
  end
  v, p = stats_get(s, p)
  r.f = base + stats_unzz(v) * k
  v, p = stats_get(s, p)
  r.l = r.f + v * k
  local u
  if unit and not implied then u, p = stats_get(s, p) end
  local idxs = {}
  if flags % 16 >= 8 then
    local len
    len, p = stats_get(s, p)
    for byte = 0, len - 1 do
      local b = string.byte(s, p + byte)
      for bit = 0, 7 do
        if b % 2 == 1 then idxs[#idxs + 1] = 8 * byte + bit end
        b = (b - b % 2) / 2
      end
    end
    p = p + len
  else
    local nw
    nw, p = stats_get(s, p)
    for j = 1, nw do idxs[j], p = stats_get(s, p) end
  end
  if packed then
    local cbase, cw, dbase, dw
    cbase, p = stats_get(s, p)
    cw, p = stats_get(s, p)
    dbase, p = stats_get(s, p)
    dw, p = stats_get(s, p)
    if cw > 53 or dw > 53 then error('stats: a packed statistics value is corrupt') end
    local bits = {s = s, p = p, off = 0}
    local total = 0
    for _, idx in ipairs(idxs) do
      local c = cbase + stats_getbits(bits, cw)
      local d = dbase + stats_getbits(bits, dw)
      r.w[idx] = {c, d * k}
      total = total + c
    end
    p = bits.p
    if bits.off > 0 then p = p + 1 end
    if implied then
      if total == 0 or (r.mx - r.mn + 1) % total ~= 0 then
        error('stats: a packed statistics value is corrupt')
      end
      u = (r.mx - r.mn + 1) / total
    end
    for _, idx in ipairs(idxs) do
      local e = r.w[idx]
      if unit then e[3] = e[1] * u else e[3], p = stats_get(s, p) end
    end
    return r
  end
  for _, idx in ipairs(idxs) do
    local c, d, i
    c, p = stats_get(s, p)
    d, p = stats_get(s, p)
    if unit then i = c * u else i, p = stats_get(s, p) end
    r.w[idx] = {c, d * k, i}
  end
  return r
end

-- The body of range r, compact when every number it writes is below 10^15, and packed
-- (flag 16) too when asked.
local function stats_encode_range(r, base, packed)
  local idxs = {}
  for idx in pairs(r.w) do idxs[#idxs + 1] = idx end
  table.sort(idxs, stats_lt)
  local ok = type(base) == 'number'
  for _, x in ipairs({r.mn, r.mx, r.f, r.l}) do
    if type(x) ~= 'number' then ok = false end
  end
  for _, idx in ipairs(idxs) do
    if type(idx) ~= 'number' then ok = false end
    for _, x in ipairs(r.w[idx]) do
      if type(x) ~= 'number' then ok = false end
    end
  end
  local bytes = {}
  if not ok then
    bytes[1] = 1
    for _, x in ipairs({r.mn, r.mx, r.f, r.l, #idxs}) do stats_putdec(bytes, x) end
    for _, idx in ipairs(idxs) do
      stats_putdec(bytes, idx)
      for _, x in ipairs(r.w[idx]) do stats_putdec(bytes, x) end
    end
    return stats_chars(bytes)
  end
  local off, span = r.f - base, r.l - r.f
  local k = 1000
  if off % 1000 ~= 0 or span % 1000 ~= 0 then k = 1 end
  local c1, i1 = r.w[idxs[1]][1], r.w[idxs[1]][3]
  local u = i1 / c1
  if u ~= math.floor(u) then u = nil end
  for _, idx in ipairs(idxs) do
    local e = r.w[idx]
    if e[2] % 1000 ~= 0 then k = 1 end
    if u and e[3] ~= e[1] * u then u = nil end
  end
  local flags = 0
  if k == 1000 then flags = flags + 2 end
  if u then flags = flags + 4 end
  local whole, implied = false, false
  if packed then
    flags = flags + 16
    whole = r.mn == 1 and r.mx == STATS_RANGE
    if whole then flags = flags + 32 end
    local total = 0
    for _, idx in ipairs(idxs) do total = total + r.w[idx][1] end
    implied = u ~= nil and u * total == r.mx - r.mn + 1
    if implied then flags = flags + 64 end
  end
  local top = idxs[#idxs]
  local maplen = (top - top % 8) / 8 + 1
  local listlen = 1
  for _, idx in ipairs(idxs) do
    listlen = listlen + 1
    if idx >= 128 then listlen = listlen + 2 end
  end
  local bitmap = maplen + 1 <= listlen
  if bitmap then flags = flags + 8 end
  bytes[1] = flags
  if not whole then
    stats_put(bytes, r.mn)
    stats_put(bytes, stats_zz(r.mx - STATS_RANGE))
  end
  stats_put(bytes, stats_zz(off / k))
  stats_put(bytes, span / k)
  if u and not implied then stats_put(bytes, u) end
  if bitmap then
    stats_put(bytes, maplen)
    local map = {}
    for byte = 1, maplen do map[byte] = 0 end
    for _, idx in ipairs(idxs) do
      local byte, bit = (idx - idx % 8) / 8 + 1, idx % 8
      map[byte] = map[byte] + 2 ^ bit
    end
    for byte = 1, maplen do bytes[#bytes + 1] = map[byte] end
  else
    stats_put(bytes, #idxs)
    for _, idx in ipairs(idxs) do stats_put(bytes, idx) end
  end
  if packed then
    local cmin, cmax, dmin, dmax
    for _, idx in ipairs(idxs) do
      local c, d = r.w[idx][1], r.w[idx][2] / k
      if not cmin or c < cmin then cmin = c end
      if not cmax or c > cmax then cmax = c end
      if not dmin or d < dmin then dmin = d end
      if not dmax or d > dmax then dmax = d end
    end
    local cw, dw = stats_width(cmax - cmin), stats_width(dmax - dmin)
    stats_put(bytes, cmin)
    stats_put(bytes, cw)
    stats_put(bytes, dmin)
    stats_put(bytes, dw)
    local bits = {bytes = bytes, cur = 0, used = 0}
    for _, idx in ipairs(idxs) do
      stats_putbits(bits, r.w[idx][1] - cmin, cw)
      stats_putbits(bits, r.w[idx][2] / k - dmin, dw)
    end
    stats_flushbits(bits)
    if not u then
      for _, idx in ipairs(idxs) do stats_put(bytes, r.w[idx][3]) end
    end
    return stats_chars(bytes)
  end
  for _, idx in ipairs(idxs) do
    local e = r.w[idx]
    stats_put(bytes, e[1])
    stats_put(bytes, e[2] / k)
    if not u then stats_put(bytes, e[3]) end
  end
  return stats_chars(bytes)
end

-- Which stored values a plan reads as absent. mask is nil (read everything), true (read
-- nothing: plan against an empty shard, for a replace that deletes the shard after
-- planning) or {[j] = {[field] = true}} (those fields of KEYS[k + j - 1] read as
-- absent: a repair that removes damaged values after planning).
local function stats_hidden(mask, j, field)
  if mask == nil then return false end
  if mask == true then return true end
  return mask[j] ~= nil and mask[j][field] == true
end

local function stats_mask(mask, j, fields, values)
  if mask == nil then return values end
  for i = 1, #fields do
    if stats_hidden(mask, j, fields[i]) then values[i] = false end
  end
  return values
end

-- A field about to take HINCRBY must hold an integer (or nothing).
local function stats_integer(key, field, v)
  if v and not string.match(v, '^%-?%d+$') then
    error('stats: ' .. key .. ' field ' .. field .. ' is not an integer; nothing was applied')
  end
end

-- An increment from the caller must be a decimal count.
local function stats_count_arg(v)
  if not v or not string.match(v, '^%d+$') or #v > 18 then
    error('stats: malformed delta argument ' .. tostring(v) .. '; nothing was applied')
  end
end

-- Decodes the delta's arguments ARGV[a ..] (the layout is in the header) into a table,
-- checking every count the caller sends. Reads no key. Returns the delta (nil for an
-- empty one) and the index of the first ARGV after it.
local function stats_decode(a)
  local n = tonumber(ARGV[a])
  if not n or n < 0 or n ~= math.floor(n) then
    error('stats: malformed delta argument count ' .. tostring(ARGV[a]) .. '; nothing was applied')
  end
  if n == 0 then return nil, a + 1 end
  local i = a + 1
  local function nxt()
    local v = ARGV[i]
    i = i + 1
    return v
  end
  local d = {}

  -- Global counters, and the completion-time bounds and update time.
  d.now, d.count, d.ids, d.dur, d.first, d.last = nxt(), nxt(), nxt(), nxt(), nxt(), nxt()
  -- The overflow guard on the delta's side (see the header).
  if #d.count > 18 or #d.ids > 18 or #d.dur > 18 then
    error('stats: a delta counter reached 10^18; nothing was applied')
  end
  for _, v in ipairs({d.now, d.count, d.ids, d.dur, d.first, d.last}) do stats_count_arg(v) end

  -- Per worker: {worker, count, ids, dur}, and the workers hash fields they touch.
  d.workers, d.names, d.fields = {}, {}, {}
  for j = 1, tonumber(nxt()) do
    local w, c, wi, wd = nxt(), nxt(), nxt(), nxt()
    stats_count_arg(c); stats_count_arg(wi); stats_count_arg(wd)
    d.workers[j] = {w, c, wi, wd}
    d.names[j] = w .. '|idx'
    d.fields[3 * j - 2], d.fields[3 * j - 1], d.fields[3 * j] =
      w .. '|count', w .. '|ids', w .. '|dur'
  end

  -- Per block of 64 ranges: {blk, ranges}, a range {slot, mn, mx, f, l, ws} with ws the
  -- flat list of its workers' (wpos, count, dur, ids).
  d.blocks = {}
  for b = 1, tonumber(nxt()) do
    local blk, nr = nxt(), tonumber(nxt())
    local ranges = {}
    for j = 1, nr do
      local slot = tonumber(nxt())
      local mn, mx, f, l = stats_num(nxt()), stats_num(nxt()), stats_num(nxt()), stats_num(nxt())
      local ws = {}
      for m = 1, tonumber(nxt()) do
        local wpos = tonumber(nxt())
        local c, dd, wi = stats_num(nxt()), stats_num(nxt()), stats_num(nxt())
        ws[4 * m - 3], ws[4 * m - 2], ws[4 * m - 1], ws[4 * m] = wpos, c, dd, wi
      end
      ranges[j] = {slot = slot, mn = mn, mx = mx, f = f, l = l, ws = ws}
    end
    d.blocks[b] = {blk = blk, ranges = ranges}
  end

  -- Per day: {day, adds}, adds the flat list of (hour from 1, count).
  d.days = {}
  for j = 1, tonumber(nxt()) do
    local day, nh = nxt(), tonumber(nxt())
    local adds = {}
    for m = 1, nh do
      adds[2 * m - 1] = tonumber(nxt()) + 1
      adds[2 * m] = stats_num(nxt())
    end
    d.days[j] = {day = day, adds = adds}
  end

  -- Duration histogram buckets.
  d.buckets, d.counts = {}, {}
  for j = 1, tonumber(nxt()) do
    d.buckets[j], d.counts[j] = nxt(), nxt()
    stats_count_arg(d.counts[j])
  end
  if i ~= a + n + 1 then
    error('stats: the delta has ' .. (i - a - 1) .. ' arguments, not ' .. n .. '; nothing was applied')
  end
  return d, a + n + 1
end

-- Reads every stored value delta d touches (one HMGET or HGET per hash field list,
-- block and day, as before any write) and checks it: counters are integers below the
-- overflow guard, packed values decode. Writes nothing. Returns what it read: cur (the
-- global fields), held and palette (the workers' fields and indexes), blocks (per
-- block: old value, base, at, order and the old ranges the delta touches), hours (per
-- day: 24 counts) and hist.
local function stats_check(k, mask, d)
  local s = {}
  -- Global counters. The overflow guard on the stored side (see the header).
  local gnames = {'count', 'ids', 'dur_sum_ms', 'first_completed_ms', 'last_completed_ms',
    'updated_ms', 'palette'}
  local cur = stats_mask(mask, 1, gnames, redis.call('HMGET', KEYS[k], unpack(gnames)))
  local gfields = {'count', 'ids', 'dur_sum_ms'}
  for j = 1, 3 do
    stats_integer(KEYS[k], gfields[j], cur[j])
    if cur[j] and #cur[j] > 18 then
      error('stats: a counter of ' .. KEYS[k] .. ' reached 10^18; nothing was applied')
    end
  end
  s.cur = cur

  -- Per worker counters and palette indexes.
  s.held = stats_mask(mask, 2, d.fields, stats_hmget(KEYS[k + 1], d.fields))
  for j = 1, #d.fields do stats_integer(KEYS[k + 1], d.fields[j], s.held[j]) end
  s.palette = stats_mask(mask, 2, d.names, stats_hmget(KEYS[k + 1], d.names))
  stats_integer(KEYS[k], 'palette', cur[7])
  for j = 1, #d.workers do
    if s.palette[j] then stats_integer(KEYS[k + 1], d.names[j], s.palette[j]) end
  end

  -- Per block: its entries' positions, and the old ranges the delta touches decoded.
  s.blocks = {}
  for b, blk in ipairs(d.blocks) do
    local old = redis.call('HGET', KEYS[k + 2], blk.blk)
    if stats_hidden(mask, 3, blk.blk) then old = false end
    local base, at, order, p = nil, {}, {}, 1
    local olds = {}
    if old then
      base, p = stats_get(old, 1)
      while p <= #old do
        local slot = string.byte(old, p)
        local len, q = stats_get(old, p + 1)
        at[slot] = {p, q, q + len - 1}
        order[#order + 1] = slot
        p = q + len
      end
      if p ~= #old + 1 then
        error('stats: ' .. KEYS[k + 2] .. ' block ' .. blk.blk .. ' is corrupt; nothing was applied')
      end
      for j, e in ipairs(blk.ranges) do
        if at[e.slot] then olds[j] = stats_decode_range(old, at[e.slot][2], base) end
      end
    end
    s.blocks[b] = {old = old, base = base, at = at, order = order, olds = olds}
  end

  -- Per day: its 24 counts.
  s.hours = {}
  for j, e in ipairs(d.days) do
    local old = redis.call('HGET', KEYS[k + 3], e.day)
    if stats_hidden(mask, 4, e.day) then old = false end
    local hours = {}
    if old then
      local wide, p = string.byte(old, 1) == 1, 2
      for h = 1, 24 do
        if wide then hours[h], p = stats_getdec(old, p) else hours[h], p = stats_get(old, p) end
      end
      if p ~= #old + 1 then
        error('stats: ' .. KEYS[k + 3] .. ' day ' .. e.day .. ' is corrupt; nothing was applied')
      end
    else
      for h = 1, 24 do hours[h] = 0 end
    end
    s.hours[j] = hours
  end

  -- Duration histogram buckets.
  local hist = stats_mask(mask, 5, d.buckets, stats_hmget(KEYS[k + 4], d.buckets))
  for j = 1, #d.buckets do stats_integer(KEYS[k + 4], d.buckets[j], hist[j]) end
  return s
end

-- Computes the writes that add delta d to the stored values s (what stats_check read):
-- a list of {command, key, args...}, in the order they are issued. Reads no key.
local function stats_compute(k, d, s, packed)
  local writes = {}
  local function later(cmd, key, ...) writes[#writes + 1] = {cmd, key, ...} end

  -- Global counters, and the completion-time bounds and update time as maxima/minima.
  local cur = s.cur
  later('HINCRBY', KEYS[k], 'count', d.count)
  if d.ids ~= '0' then later('HINCRBY', KEYS[k], 'ids', d.ids) end
  if d.dur ~= '0' then later('HINCRBY', KEYS[k], 'dur_sum_ms', d.dur) end
  local set = {}
  if not cur[4] or id_lt(d.first, cur[4]) then
    set[#set + 1], set[#set + 2] = 'first_completed_ms', d.first
  end
  if not cur[5] or id_lt(cur[5], d.last) then
    set[#set + 1], set[#set + 2] = 'last_completed_ms', d.last
  end
  if not cur[6] or id_lt(cur[6], d.now) then
    set[#set + 1], set[#set + 2] = 'updated_ms', d.now
  end
  if #set > 0 then later('HSET', KEYS[k], unpack(set)) end

  -- Per worker, and its palette index (allocated on its first completion, from the
  -- global field `palette`, the next index).
  local palette = s.palette
  local next_index = tonumber(cur[7] or '0')
  for j, e in ipairs(d.workers) do
    local w, c, wi, wd = e[1], e[2], e[3], e[4]
    later('HINCRBY', KEYS[k + 1], w .. '|count', c)
    if wi ~= '0' then later('HINCRBY', KEYS[k + 1], w .. '|ids', wi) end
    if wd ~= '0' then later('HINCRBY', KEYS[k + 1], w .. '|dur', wd) end
    if palette[j] then
      palette[j] = tonumber(palette[j])
    else
      palette[j] = next_index
      next_index = next_index + 1
      later('HSET', KEYS[k + 1], d.names[j], palette[j])
    end
  end
  if next_index ~= tonumber(cur[7] or '0') then
    later('HSET', KEYS[k], 'palette', next_index)
  end

  -- Per range of STATS_RANGE IDs, one block value of 64 ranges at a time: only the ranges the
  -- delta touches are decoded, and the block is written back with the untouched entries
  -- copied.
  for b, blk in ipairs(d.blocks) do
    local sb = s.blocks[b]
    local old, base, at, order = sb.old, sb.base, sb.at, sb.order
    local new, slots = {}, {}
    for j, e in ipairs(blk.ranges) do
      local slot = e.slot
      if base == nil then
        base = 0
        if type(e.f) == 'number' then base = e.f end
      end
      local r = sb.olds[j]
      if r then
        if stats_lt(e.mn, r.mn) then r.mn = e.mn end
        if stats_lt(r.mx, e.mx) then r.mx = e.mx end
        if stats_lt(e.f, r.f) then r.f = e.f end
        if stats_lt(r.l, e.l) then r.l = e.l end
      else
        r = {mn = e.mn, mx = e.mx, f = e.f, l = e.l, w = {}}
      end
      local ws = e.ws
      for m = 1, #ws, 4 do
        local idx = palette[ws[m]]
        local c, dd, wi = ws[m + 1], ws[m + 2], ws[m + 3]
        local x = r.w[idx]
        if x then
          x[1], x[2], x[3] = stats_add(x[1], c), stats_add(x[2], dd), stats_add(x[3], wi)
        else
          r.w[idx] = {c, dd, wi}
        end
      end
      local body = stats_encode_range(r, base, packed)
      local head = {slot}
      stats_put(head, #body)
      new[slot] = stats_chars(head) .. body
      slots[#slots + 1] = slot
    end
    -- Merge the untouched entries (copied in runs) with the new ones, by slot.
    local head = {}
    stats_put(head, base)
    local parts, from, to = {stats_chars(head)}, nil, nil
    local oi, ni = 1, 1
    while oi <= #order or ni <= #slots do
      local o, sl = order[oi], slots[ni]
      if sl and (not o or sl <= o) then
        if from then parts[#parts + 1] = string.sub(old, from, to); from = nil end
        parts[#parts + 1] = new[sl]
        ni = ni + 1
        if o == sl then oi = oi + 1 end
      else
        if not from then from = at[o][1] end
        to = at[o][3]
        oi = oi + 1
      end
    end
    if from then parts[#parts + 1] = string.sub(old, from, to) end
    later('HSET', KEYS[k + 2], blk.blk, table.concat(parts))
  end

  -- Hourly completions, one value of 24 counts per day.
  for j, e in ipairs(d.days) do
    local hours, adds = s.hours[j], e.adds
    for m = 1, #adds, 2 do
      local h = adds[m]
      hours[h] = stats_add(hours[h], adds[m + 1])
    end
    local bytes = {0}
    for h = 1, 24 do
      if type(hours[h]) ~= 'number' then bytes[1] = 1 end
    end
    for h = 1, 24 do
      if bytes[1] == 1 then stats_putdec(bytes, hours[h]) else stats_put(bytes, hours[h]) end
    end
    later('HSET', KEYS[k + 3], e.day, stats_chars(bytes))
  end

  -- Duration histogram buckets.
  for j = 1, #d.buckets do
    later('HINCRBY', KEYS[k + 4], d.buckets[j], d.counts[j])
  end
  return writes
end

-- Plans delta ARGV[a ..] against KEYS[k .. k + 4]: decodes it, reads and checks what it
-- touches, and computes the writes, writing nothing. Redis does not undo a script's
-- writes when a later step fails, so malformed arguments, a corrupt packed value or a
-- counter that is not an integer fail the call here, before anything is written.
-- Returns the writes (for stats_write) and the index of the first ARGV after the delta.
-- With packed, the ranges the delta touches are written as packed bodies (archive
-- format 3); untouched ones keep their bytes, whichever layout they have.
local function stats_plan(k, a, mask, packed)
  local d, after = stats_decode(a)
  if d == nil then return {}, after end
  local s = stats_check(k, mask, d)
  return stats_compute(k, d, s, packed == true), after
end

-- Issues the writes of a `stats_plan`.
local function stats_write(writes)
  for _, w in ipairs(writes) do
    local key = w[2]
    redis.call(w[1], key, unpack(w, 3))
  end
end

local function apply_stats(k, a, packed)
  local writes, after = stats_plan(k, a, nil, packed)
  stats_write(writes)
  return after
end
