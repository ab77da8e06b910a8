-- Shared prelude (prepended to every script). P is the partition's key prefix, e.g.
-- "sundial:{7}:", so every key a script touches lives in one cluster slot.

-- The store's clock, read once per script call: a script is one atomic step, so all
-- of it happens at one instant (and one TIME is a command, not two or three).
local store_time_reply
local function store_time()
  if not store_time_reply then
    store_time_reply = redis.call('TIME')
  end
  return store_time_reply
end
local function store_now_ms()
  local t = store_time()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function store_now_us()
  local t = store_time()
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Lua's tostring() prints 14 significant digits; µs tokens need all of theirs.
local function int(n)
  return string.format('%.0f', n)
end
