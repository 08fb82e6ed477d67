-- apply: apply one statistics delta to one shard (apply_delta.lua is prepended).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- ARGV[1] n, then the n delta arguments (delta_args), then optionally the ranges
--      layout: 1 (compact bodies, read by every version) or 2 (packed bodies, read from
--      archive format 3 on)
-- Reply: n + 2, the index after the delta.
local n = ARGV[1] and string.match(ARGV[1], '^%d+$') and tonumber(ARGV[1])
if not n then
  error('apply: delta argument count `' .. tostring(ARGV[1]) .. '`; nothing was applied')
end
local layout = ARGV[n + 2]
if #ARGV > n + 2 or (layout ~= nil and layout ~= '1' and layout ~= '2') then
  error('apply: ranges layout `' .. tostring(layout) .. '`; nothing was applied')
end
return apply_stats(1, 1, layout == '2')
