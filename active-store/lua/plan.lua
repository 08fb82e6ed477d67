-- plan: validate a plan against the namespace's registry and record it, atomically: a
-- rejected plan writes nothing, and the same plan twice is a no-op.
-- KEYS[1] plan registry list, entries "kind|first pid|last pid|min id|max id|size"
--      (kind u: uniform, issued from per-shard cursors; r: one explicit range)
-- ARGV[1] kind; for u: min, max, size, partition count; for r: (min, max, width) per
--      range, sorted and non-overlapping (the client checks that)
-- Reply: {created (1/0), then (first pid, last pid, min, max, size) per entry the request
--      maps to, new or already there}; an error reply naming the conflict otherwise.

-- IDs are decimal strings of up to 20 digits: compared exactly (`id_lt`, common.lua),
-- not as doubles.
local function overlaps(amin, amax, bmin, bmax)
  return not (id_lt(amax, bmin) or id_lt(bmax, amin))
end

-- Every argument and every registry entry is checked before the one write.
local function range(min, max, size)
  id(min, 'min id')
  id(max, 'max id')
  if id(size, 'size') == '0' then refuse('size', size) end
  if id_lt(max, min) then refuse('range', min .. '..=' .. max) end
end
if ARGV[1] == 'u' then
  if #ARGV ~= 5 then refuse('argument count', #ARGV) end
  range(ARGV[2], ARGV[3], ARGV[4])
  pos(ARGV[5], 'partition count')
elseif ARGV[1] == 'r' then
  entries(1, 3, true)
  for i = 2, #ARGV, 3 do range(ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
else
  refuse('plan kind', ARGV[1])
end

local entries = {}
local next_pid = 1
for i, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local f = {}
  for part in string.gmatch(e, '[^|]+') do f[#f + 1] = part end
  if #f ~= 6 or (f[1] ~= 'u' and f[1] ~= 'r') or not is_num(f[2]) or not is_num(f[3])
      or not is_id(f[4]) or not is_id(f[5]) or not is_id(f[6]) then
    corrupt(KEYS[1], i - 1, 'plan entry `' .. e .. '`')
  end
  entries[#entries + 1] = f
  next_pid = math.max(next_pid, tonumber(f[3]) + 1)
end

-- The entry equal to (kind, min, max, size), or nil; an error reply on any other overlap.
local function find(kind, min, max, size)
  for _, e in ipairs(entries) do
    if e[1] == kind and e[4] == min and e[5] == max and e[6] == size then return e end
    if overlaps(min, max, e[4], e[5]) then
      return redis.error_reply('PLAN ids ' .. min .. '..=' .. max .. ' overlap the existing plan ' .. e[4] .. '..=' .. e[5])
    end
  end
  return nil
end

local out, new = {}, {}
if ARGV[1] == 'u' then
  local min, max, size, count = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  local f = find('u', min, max, size)
  if f and f.err then return f end
  if not f then
    f = {'u', int(next_pid), int(next_pid + count - 1), min, max, size}
    new[#new + 1] = f
  end
  out = {f[2], f[3], f[4], f[5], f[6]}
else
  for i = 2, #ARGV, 3 do
    local min, max, width = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    -- An explicit range is a plan of one partition as wide as the range.
    local f = find('r', min, max, width)
    if f and f.err then return f end
    if not f then
      f = {'r', int(next_pid), int(next_pid), min, max, width}
      next_pid = next_pid + 1
      new[#new + 1] = f
    end
    for _, v in ipairs({f[2], f[3], f[4], f[5], f[6]}) do out[#out + 1] = v end
  end
end
for _, f in ipairs(new) do
  redis.call('RPUSH', KEYS[1], table.concat(f, '|'))
end
table.insert(out, 1, #new > 0 and 1 or 0)
return out
