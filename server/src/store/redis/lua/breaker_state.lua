-- ARGV: B (the breakers' prefix), destination, probe_ms. Reply: {state, until}:
-- 'closed', 'open' (until), or 'half_open' (this caller may probe).
local key = ARGV[1] .. 'breaker:' .. ARGV[2]
local b = redis.call('HMGET', key, 'state', 'until')
local state, untl = b[1], tonumber(b[2]) or 0
if not state or state == 'closed' then
  return { 'closed', '0' }
end
local now = store_now_ms()
if untl > now then
  -- Open, or half open with another caller's probe under way.
  return { 'open', int(untl) }
end
local probe_until = now + tonumber(ARGV[3])
redis.call('HSET', key, 'state', 'half_open', 'until', int(probe_until))
redis.call('PEXPIRE', key, 86400000)
return { 'half_open', int(probe_until) }
