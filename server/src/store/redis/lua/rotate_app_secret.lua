-- ARGV: key, new_secret, overlap_ms. The secrets that sign now keep signing for the
-- overlap; ended ones are dropped; the new one is appended with no end. Returns the
-- stored JSON, or '' when the app does not exist.
local key = ARGV[1]
local j = redis.call('GET', key)
if not j then
  return ''
end
local app = cjson.decode(j)
local now = store_now_ms()
local until_ms = now + tonumber(ARGV[3])
local kept = {}
for _, s in ipairs(app.secrets or {}) do
  local na = tonumber(s.not_after) or 0
  if na == 0 or na > now then
    if na == 0 or na > until_ms then
      s.not_after = until_ms
    end
    kept[#kept + 1] = s
  end
end
kept[#kept + 1] = { secret = ARGV[2], not_after = 0 }
app.secrets = kept
local json = cjson.encode(app)
redis.call('SET', key, json)
return json
