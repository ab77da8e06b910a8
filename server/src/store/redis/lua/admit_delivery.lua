-- ARGV: B (the breakers' prefix), destination, holder, limit, lease_ms, probe_ms.
-- Reply: {verdict, n}: 'go', 'probe' (this caller is the breaker's probe), 'open' (n:
-- until), 'full' (n: the window).
-- Keys: B..'breaker:'..destination (hash: state, until, failures, ramp) and
-- B..'pace:'..destination (zset: holder → its slot's lease end).
local bkey = ARGV[1] .. 'breaker:' .. ARGV[2]
local pkey = ARGV[1] .. 'pace:' .. ARGV[2]
local holder, limit = ARGV[3], math.max(1, tonumber(ARGV[4]))
local b = redis.call('HMGET', bkey, 'state', 'until', 'ramp')
local state, untl, ramp = b[1] or 'closed', tonumber(b[2]) or 0, tonumber(b[3])
local now = store_now_ms()
if state == 'open' and untl > now then
  return { 'open', int(untl) }
end
if state == 'half_open' and untl > now then
  -- Another caller's probe holds the only slot.
  return { 'full', '1' }
end
local window = limit
if state ~= 'closed' then
  window = 1 -- the probe goes alone
elseif ramp and ramp < window then
  window = ramp
end
local function full()
  return not redis.call('ZSCORE', pkey, holder) and redis.call('ZCARD', pkey) >= window
end
-- Slots whose lease ran out are dropped only when they would keep this one out.
if full() then
  redis.call('ZREMRANGEBYSCORE', pkey, '-inf', now)
  if full() then
    return { 'full', int(window) }
  end
end
local lease = tonumber(ARGV[5])
redis.call('ZADD', pkey, now + lease, holder)
if redis.call('PTTL', pkey) < lease then
  redis.call('PEXPIRE', pkey, lease)
end
if state ~= 'closed' then
  redis.call('HSET', bkey, 'state', 'half_open', 'until', int(now + tonumber(ARGV[6])))
  redis.call('PEXPIRE', bkey, 86400000)
  return { 'probe', '0' }
end
return { 'go', '0' }
