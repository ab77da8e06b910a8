-- ARGV: P, job_id, schedule_id, holder, ttl_ms
-- Token = max(job counter + 1, store time in µs): tokens keep growing even if Redis
-- lost its last second of writes (the counter went back, the clock did not).
local P, id, sid, holder = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = store_now_ms()
local lease = P .. 'lease:' .. sid
local cur = redis.call('HMGET', lease, 'holder', 'expires')
if cur[1] and cur[1] ~= holder and tonumber(cur[2]) > now then
  return {'held', cur[1]}
end
local counter = tonumber(redis.call('HGET', P .. 'tokens', id) or '0')
local token = math.max(counter + 1, store_now_us())
local expires = now + tonumber(ARGV[5])
redis.call('HSET', P .. 'tokens', id, int(token))
redis.call('HSET', lease, 'holder', holder, 'token', int(token), 'expires', int(expires))
redis.call('ZADD', P .. 'leases', int(expires), sid)
return {'ok', int(token), int(expires)}
