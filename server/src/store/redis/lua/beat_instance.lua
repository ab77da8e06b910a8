-- ARGV: K (the instances zset: instance -> end of its last beat), instance, ttl_ms
-- Marks the instance alive until now + ttl (store clock) and returns how many other
-- instances are alive, then the other instances whose last beat has run out: they
-- died (or stalled past their TTL), and the triggers they hold unacknowledged are for
-- the taking.
local K, me = ARGV[1], ARGV[2]
local now = store_now_ms()
redis.call('ZADD', K, int(now + tonumber(ARGV[3])), me)
local out = { redis.call('ZCOUNT', K, '(' .. int(now), '+inf') - 1 }
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K, '-inf', '(' .. int(now))) do
  if id ~= me then
    out[#out + 1] = id
  end
end
return out
