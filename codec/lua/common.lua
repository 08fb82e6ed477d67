-- common: the prelude of every script of the active store, the archive store and the
-- statistics, put first by tranche-codec's `lua::compose` (not a script itself). The
-- names in capitals it reads (BITMAP_BITS, GROW_FROM, SDS_OVERHEAD, SIZE_CLASSES) are
-- `local` lines written in front of it from their Rust definitions (`lua.rs`).

-- Whether a < b for canonical decimals (no sign, no leading zero): by length, then
-- bytes. Row IDs, pids, tokens and checkpoints stay strings: Lua numbers are doubles
-- and would round them above 2^53.
local function id_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- Runs `cmd key list...` in chunks: Lua's unpack is limited to a few thousand values.
local function variadic(cmd, key, list)
  for i = 1, #list, 4000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
  end
end

-- Whether the canonical decimal `bit` is an offset a bitmap holds: below BITMAP_BITS,
-- where a Redis string (512 MB) ends. BITFIELD refuses anything past it.
local function in_bitmap(bit)
  return #bit <= 10 and tonumber(bit) < BITMAP_BITS
end

-- Grows the bitmap `key` to hold bit offset `top` (a number; -1: none), for a caller
-- about to set bits up to it. A bitmap of GROW_FROM bytes or more is grown here, to just
-- under an allocator size class (SIZE_CLASSES per power of two; a string that long has
-- SDS_OVERHEAD bytes of header and NUL), by one SET of its old bits and zeros: Redis
-- would grow it itself by doubling, and a bitmap of 5 million bits (625 KB) would then
-- hold 1.25 MB. Its zero tail reads as clear bits. Never past the 512 MB BITFIELD
-- addresses: an offset beyond it is left to BITFIELD, which refuses it before it
-- writes. A write: call it after every check.
local function grow_bitmap(key, top)
  local need, most = math.floor(top / 8) + 1, BITMAP_BITS / 8
  if need < GROW_FROM or need > most then return end
  local len = redis.call('STRLEN', key)
  if need <= len then return end
  local step = 1
  while step * 2 <= need + SDS_OVERHEAD do step = step * 2 end
  step = step / SIZE_CLASSES
  local size = math.ceil((need + SDS_OVERHEAD) / step) * step - SDS_OVERHEAD
  if size > most then size = most end
  local old = redis.call('GET', key) or ''
  redis.call('SET', key, old .. string.rep('\0', size - #old))
end

-- Reserves `n` fencing tokens from the sequence `key` and returns the one before the
-- first: the caller's tokens are that + 1 .. that + n. Every later call on a lease must
-- present its token (fencing). Tokens never fall below the server's clock in ms times
-- 1024: if a failover to a replica that lagged rolls the sequence back (replication is
-- asynchronous), the next tokens still exceed every token handed out before, so two
-- live leases never share one. (At most 1024 tokens per ms and shard keep the sequence
-- from running ahead of the clock; 2^53 is reached in the year 2248.) A write: call it
-- after every check.
local function reserve_tokens(key, n)
  local now = redis.call('TIME')
  local floor = (tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)) * 1024
  local token = tonumber(redis.call('INCRBY', key, n)) - n
  if token < floor then
    redis.call('SET', key, string.format('%d', floor + n))
    token = floor
  end
  return token
end

-- Refuses the call when `key` holds a value of another type than `kind` ('hash', 'zset',
-- 'string', 'list', 'stream'); an absent key passes. Redis answers a command on a key
-- of the wrong type with WRONGTYPE but keeps what the script wrote before it (no
-- rollback), so every key a script writes must meet its type check before the first
-- write. A read of the key does that for free (it fails first), and so does the first
-- write itself (a refused command writes nothing): a script orders its commands so, and
-- calls this (one TYPE) only for a key it writes later without having read it.
local function expect_type(key, kind)
  local t = redis.call('TYPE', key).ok
  if t ~= kind and t ~= 'none' then
    error({err = 'WRONGTYPE ' .. key .. ' holds a ' .. t .. ', not a ' .. kind})
  end
end
