-- ARGV: key, app_json. Stores the app unless its id exists; created_at 0 becomes
-- the store's now. Returns the stored JSON, or '' when the app exists.
local key = ARGV[1]
if redis.call('EXISTS', key) == 1 then
  return ''
end
local app = cjson.decode(ARGV[2])
if (tonumber(app.created_at) or 0) == 0 then
  app.created_at = store_now_ms()
end
local json = cjson.encode(app)
redis.call('SET', key, json)
return json
