-- Tests only (cfg(test) builds put it first and route every script's redis.call
-- through it): a function whose call is checked (`checked_keys`, its declared KEYS)
-- may touch a key of its call's slot (the hash tag of its first key) only if it
-- declared it, so Redis Cluster could redirect the whole call while that slot moves
-- between masters. A key of another slot (a node's lease count on one Redis) is left
-- to the cluster tests, where Redis itself refuses it.
local checked_keys = nil
local KEYLESS = { TIME = true, PUBLISH = true }
local ALL_KEYS = { DEL = true, EXISTS = true, MGET = true, UNLINK = true }
-- Commands whose first argument is a subcommand: the key is the second.
local KEY_SECOND = { XINFO = true, XGROUP = true }
local function slot_tag(key)
  local open = string.find(key, '{', 1, true)
  local close = open and string.find(key, '}', open + 1, true)
  if not close or close == open + 1 then
    return key
  end
  return string.sub(key, open + 1, close - 1)
end
local function checked_call(cmd, ...)
  if checked_keys and not KEYLESS[string.upper(cmd)] then
    local args = { ... }
    local first, last = 1, 1
    if ALL_KEYS[string.upper(cmd)] then
      last = #args
    elseif KEY_SECOND[string.upper(cmd)] then
      first, last = 2, 2
    end
    local tag = slot_tag(checked_keys[1])
    for i = first, last do
      local key = tostring(args[i])
      if slot_tag(key) == tag then
        local declared = false
        for _, k in ipairs(checked_keys) do
          if k == key then
            declared = true
            break
          end
        end
        if not declared then
          error('undeclared key ' .. key .. ' (' .. string.upper(cmd) .. ')')
        end
      end
    end
  end
  return redis.call(cmd, ...)
end
