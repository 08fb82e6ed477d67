-- control: the prelude of the control crate's scripts, put after common.lua (the
-- workspace's, tranche-codec's) by `lua::compose` (not a script itself).

-- A millisecond time argument: an integer in [0, 1e14] (cjson keeps 14 digits), or nil.
local function ms_arg(v)
    local n = tonumber(v)
    if n == nil or n ~= math.floor(n) or n < 0 or n > 1e14 then return nil end
    return n
end

-- Whether a decoded value holds only finite numbers within 120 levels: cjson reads 1e999
-- as inf (which it then cannot encode) and nests deeper than the readers' decoder.
local function sound(v, depth)
    if type(v) == 'number' then return v == v and v ~= math.huge and v ~= -math.huge end
    if type(v) ~= 'table' then return true end
    if depth > 120 then return false end
    for k, x in pairs(v) do
        if not sound(k, depth + 1) or not sound(x, depth + 1) then return false end
    end
    return true
end
