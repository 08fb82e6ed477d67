-- split_request: ask the holder of a running part of partition P to cut it (split.lua).
-- KEYS[1] active hash   KEYS[2] splits hash   KEYS[3] pieces hash
-- ARGV[1] pid   ARGV[2] part: 'o' (P's owner part) or a piece's start ID   ARGV[3] the
--      holder's token the requester saw   ARGV[4] cut points: the first IDs of the pieces
--      asked for, ','-separated, increasing (at most 64)   ARGV[5] for each, the highest
--      first ID allowed (below the next point), as many   ARGV[6] requester
--      ARGV[7] now ms   ARGV[8] ms after which a request not served yet may be replaced
--      ARGV[9] P's first ID   ARGV[10] P's last ID as planned   ARGV[11] P's completed
--      record up to its completion time (JSON prefix)
-- Reply: 1 requested; -2 the part is not running under that token; -3 P has a request
--      waiting (one for the same part is replaced by one asking for more pieces); -4 a
--      cut point is past its limit, the first at or below the part's checkpoint, or the
--      last limit past the part's end.
-- Every argument and every value read is checked before the one write.
if #ARGV ~= 11 then refuse('argument count', #ARGV) end
local pid, part, token = id(ARGV[1], 'pid'), ARGV[2], id(ARGV[3], 'token')
if part ~= 'o' then id(part, 'part') end
local points, limits = id_list(ARGV[4]), id_list(ARGV[5])
if not points then refuse('points', ARGV[4]) end
if not limits or #limits ~= #points then refuse('limits', ARGV[5]) end
local too_small = false
for i = 1, #points do
  if id_lt(limits[i], points[i]) then too_small = true end
  if i > 1 and not id_lt(limits[i - 1], points[i]) then refuse('points', ARGV[4]) end
end
local requester = worker_id(ARGV[6], 'requester')
local now, stale = num(ARGV[7], 'now'), num(ARGV[8], 'stale ms')
local first, last, prefix = id(ARGV[9], 'first id'), id(ARGV[10], 'last id'), ARGV[11]
if id_lt(last, first) then refuse('last id', last) end
if string.sub(prefix, 1, 1) ~= '{' or string.find(prefix, '[\n|]') then refuse('record prefix', prefix) end

local s = redis.call('HGET', KEYS[1], pid)
if not s then return -2 end
local p = checked(KEYS[1], pid, s)
if p[9] ~= '' and p[9] ~= first then refuse('first id', first) end
local r = p
if part ~= 'o' then
  local ps = redis.call('HGET', KEYS[3], pid .. ':' .. part)
  if not ps then return -2 end
  r = checked(KEYS[3], pid .. ':' .. part, ps)
end
if r[1] ~= 'r' or r[3] ~= token then return -2 end
local raw = redis.call('HGET', KEYS[2], pid)
local e
if raw then
  e = split_decode(KEYS[2], pid, raw)
  if e[1] ~= '' and now - tonumber(e[5]) < stale
      and not (e[1] == part and #points > #id_list(e[2])) then
    return -3
  end
else
  e = {'', '', '', '', '', '0', '0', p[6] ~= '' and p[6] or int(now), first, last, prefix}
end
local top = r[10] ~= '' and r[10] or last
if too_small or id_lt(top, limits[#limits])
    or not id_lt(r[11] ~= '' and r[11] or first, points[1]) then
  return -4
end
e[1], e[2], e[3], e[4], e[5] = part, ARGV[4], ARGV[5], requester, int(now)
redis.call('HSET', KEYS[2], pid, split_encode(e))
return 1
