-- Shared prelude (prepended to every script). P is the partition's key prefix, e.g.
-- "sundial:{7}:", so every key a script touches lives in one cluster slot.
local function store_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function store_now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Lua's tostring() prints 14 significant digits; µs tokens need all of theirs.
local function int(n)
  return string.format('%.0f', n)
end
