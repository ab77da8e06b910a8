-- ARGV: P, schedule_id, token, ttl_ms. Only the current token of an unexpired lease renews.
local P, sid = ARGV[1], ARGV[2]
local now = store_now_ms()
local lease = P .. 'lease:' .. sid
local cur = redis.call('HMGET', lease, 'holder', 'token', 'expires')
if not cur[1] or cur[2] ~= ARGV[3] or tonumber(cur[3]) <= now then
  return {'stale'}
end
local expires = now + tonumber(ARGV[4])
redis.call('HSET', lease, 'expires', int(expires))
redis.call('ZADD', P .. 'leases', int(expires), sid)
return {'ok', cur[1], int(expires)}
