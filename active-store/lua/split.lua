-- Split prelude, prepended (after record.lua) to the scripts that meet split partitions:
-- heartbeat, complete, fail, reap, discard and the piece scripts. Not a script itself.
--
-- A split partition P has an entry in the shard's `splits` hash (field pid), one string
-- of eleven '|'-separated fields:
--   1 request: '' none, 'o' for P's owner part, or the start ID of the piece asked to cut
--   2 requested cut points: the pieces' first IDs, ','-separated, increasing (one per
--   piece asked for)   3 the highest first ID allowed for each of those pieces, as many,
--   ','-separated (each piece keeps at least the minimum piece size)   4 requester
--   5 requested at (ms)
--   6 pieces outstanding   7 owner part done ('0' or '1')   8 first claimed (ms)
--   9 P's first ID   10 P's last ID as planned   11 P's completed record up to its
--   completion time: JSON text ending before `,"completed_at":`, made by the client
-- A piece is a record of record.lua's shape in the `pieces` hash, field `pid:start`
-- (start: the piece's first ID, fixed for its life; its last ID shrinks when it is cut
-- in turn), pending in `piece_pending` (score: ready ms) or leased in `piece_leases`
-- (score: deadline ms). The owner part and every piece are cut only in the call of
-- their holder, at or past the first ID the holder has not handed out (`next`), so no
-- ID is ever under two live leases. Pieces are not counted: P stays one partition, in
-- its status, until the last of its parts completes it. A piece spends attempts as a
-- partition does (piece_fail.lua); its last, or a permanent failure, fails P, whole
-- again, and ends every part of it (`unsplit_plan` below). So does the last attempt of
-- P's owner part (fail.lua, reap.lua), and discard.lua gives P up whole.
--
-- IDs are compared as canonical decimals (`id_lt`); `pred` steps one down by string,
-- exact at any size: no ID is ever a Lua number.

-- A ','-separated list of IDs as a table, or nil if it is not one (at most 64).
local function id_list(s)
  local out, n = {}, 0
  for v in string.gmatch(s .. ',', '([^,]*),') do
    if not is_id(v) or n == 64 then return nil end
    n = n + 1
    out[n] = v
  end
  return out
end

local function split_decode(key, pid, s)
  local e, i = {}, 1
  for n = 1, 10 do
    local j = string.find(s, '|', i, true)
    if not j then corrupt(key, pid, 'not a split entry `' .. s .. '`') end
    e[n] = string.sub(s, i, j - 1)
    i = j + 1
  end
  e[11] = string.sub(s, i)
  if not (e[1] == '' or e[1] == 'o' or is_id(e[1])) or (e[2] ~= '' and not id_list(e[2]))
    or (e[3] ~= '' and not id_list(e[3])) or (e[5] ~= '' and not is_num(e[5]))
    or not is_num(e[6]) or not (e[7] == '0' or e[7] == '1') or not is_num(e[8])
    or not is_id(e[9]) or not is_id(e[10]) or string.sub(e[11], 1, 1) ~= '{' then
    corrupt(key, pid, 'split entry `' .. s .. '`')
  end
  return e
end

local function split_encode(e)
  return table.concat(e, '|', 1, 11)
end

-- The request fields emptied: the request was served or dropped.
local function unrequest(e)
  e[1], e[2], e[3], e[4], e[5] = '', '', '', '', ''
end

-- `v - 1` for a canonical decimal `v` > 0, by string.
local function pred(v)
  local i = #v
  while string.sub(v, i, i) == '0' do i = i - 1 end
  local d = string.byte(v, i) - 48
  local out = string.sub(v, 1, i - 1) .. string.char(47 + d) .. string.rep('9', #v - i)
  out = string.gsub(out, '^0+', '')
  if out == '' then return '0' end
  return out
end

-- `v + 1` for a canonical decimal `v` below U64_MAX, by string.
local function succ(v)
  local i = #v
  while i > 0 and string.byte(v, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #v) end
  return string.sub(v, 1, i - 1) .. string.char(string.byte(v, i) + 1) .. string.rep('0', #v - i)
end

-- A piece's field `pid:start`, checked; returns pid and start.
local function piece_key(v, what)
  local pid, start = string.match(type(v) == 'string' and v or '', '^(%d+):(%d+)$')
  if not pid or not is_id(pid) or not is_id(start) then refuse(what, v) end
  return pid, start
end

-- ms as the canonical seconds text of the completed records (codec's `write_seconds`).
local function seconds(ms)
  local s, frac = int(math.floor(ms / 1000)), ms % 1000
  if frac == 0 then return s end
  local f = string.format('%03d', frac)
  f = string.gsub(f, '0+$', '')
  return s .. '.' .. f
end

-- ms from that canonical text.
local function ms_of(text)
  local s, f = string.match(text, '^(%d+)%.?(%d*)$')
  if not s then return nil end
  f = string.sub(f .. '000', 1, 3)
  return tonumber(s) * 1000 + tonumber(f)
end

-- P's completed record: the entry's prefix, completed at `now` ms, lasting from its
-- first claim.
local function finished_record(e, now)
  local duration = now - tonumber(e[8])
  if duration < 0 then duration = 0 end
  return e[11] .. ',"completed_at":' .. seconds(now) .. ',"duration":' .. seconds(duration) .. '}'
end

-- Serves a request at `holder` ('o' or a piece's start) on the record `r` of a part of
-- P it holds, if the entry `e` has one for it. Each requested piece i starts at the
-- later of its point and `next` (the first ID the holder has not handed out) unless
-- that is past its limit: the pieces whose limit `next` passed stay the holder's, the
-- first kept one may start late (at `next`), the rest start at their points. The
-- holder's last ID becomes the one before the first piece; each piece ends before the
-- next, the last at `last` (the part's last ID now). Returns the pieces as a list of
-- {start, record} (empty: the request is dropped). Writes nothing: the caller writes
-- `r`, `e` and the pieces.
local function cut(e, holder, r, last, next, now)
  if e[1] ~= holder or next == '' then return {} end
  local points, limits = id_list(e[2]), id_list(e[3])
  unrequest(e)
  local first = r[9] ~= '' and r[9] or e[9]
  local starts, n = {}, 0
  for i = 1, #points do
    local s = points[i]
    if n == 0 and id_lt(s, next) then s = next end
    if not id_lt(limits[i], s) and not id_lt(last, s) and id_lt(first, s) then
      n = n + 1
      starts[n] = s
    end
  end
  if n == 0 then return {} end
  r[9] = first
  local out = {}
  for i = 1, n do
    local s = starts[i]
    local to = i < n and pred(starts[i + 1]) or last
    out[i] = {s, {'p', '0', '', '', now, '', now, '', s, to, s, ''}}
  end
  e[6] = int(tonumber(e[6]) + n)
  r[10] = pred(starts[1])
  return out
end

-- `unsplit` (src/split.rs, step 4), read and checked: split partition `pid`, its entry
-- `e`, failing for good or discarded, is whole again. Returns the fields of its pieces
-- in `all` (the pieces hash `key` as HGETALL read it), every one to go with its pending
-- or lease entry (a piece still running is fenced: its record gone, its holder's beat,
-- completion and failure are refused as lost), and the checkpoint the partition is
-- whole again from: the lowest ID any unfinished part had not done, of `from` (its
-- owner part's checkpoint, nil if that part is done) and every piece's (`latest[field]`
-- in place of a piece's stored one, where given), else its first ID. Writes nothing:
-- the caller deletes the pieces and the entry, and gives the record its planned range
-- (`e[9]`, `e[10]`) and that checkpoint.
local function unsplit_plan(key, all, pid, e, from, latest)
  local prefix, gone = pid .. ':', {}
  for i = 1, #all, 2 do
    local field = all[i]
    if string.sub(field, 1, #prefix) == prefix then
      local q = latest and latest[field] or checked(key, field, all[i + 1])[11]
      gone[#gone + 1] = field
      if q ~= '' and (not from or id_lt(q, from)) then from = q end
    end
  end
  return gone, from or e[9]
end
