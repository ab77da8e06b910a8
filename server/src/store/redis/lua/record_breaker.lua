-- ARGV: B, destination, success (1/0), threshold, cool_down_ms. Reply: {state,
-- until, changed (1/0)}.
local key = ARGV[1] .. 'breaker:' .. ARGV[2]
local b = redis.call('HMGET', key, 'state', 'until', 'failures')
local state, untl, failures = b[1] or 'closed', tonumber(b[2]) or 0, tonumber(b[3]) or 0
if ARGV[3] == '1' then
  redis.call('DEL', key)
  return { 'closed', '0', state ~= 'closed' and '1' or '0' }
end
if state == 'open' then
  return { 'open', int(untl), '0' }
end
local now = store_now_ms()
failures = failures + 1
if state == 'half_open' or failures >= tonumber(ARGV[4]) then
  untl = now + tonumber(ARGV[5])
  redis.call('HSET', key, 'state', 'open', 'until', int(untl), 'failures', failures)
  redis.call('PEXPIRE', key, 86400000)
  return { 'open', int(untl), '1' }
end
redis.call('HSET', key, 'state', 'closed', 'failures', failures)
redis.call('PEXPIRE', key, 86400000)
return { 'closed', '0', '0' }
