-- ARGV: B (the breakers' prefix), destination, holder, answered ('1', '0', or '' for
-- no attempt), threshold, cool_down_ms, limit. Reply: {state, until, changed (1/0)},
-- or {} when nothing was counted. Keys: as admit_delivery's.
local bkey = ARGV[1] .. 'breaker:' .. ARGV[2]
redis.call('ZREM', ARGV[1] .. 'pace:' .. ARGV[2], ARGV[3])
if ARGV[4] == '' then
  return {}
end
local b = redis.call('HMGET', bkey, 'state', 'until', 'failures', 'ramp')
local state, untl, failures = b[1] or 'closed', tonumber(b[2]) or 0, tonumber(b[3]) or 0
local ramp = tonumber(b[4])
local limit = math.max(1, tonumber(ARGV[7]))
if ARGV[4] == '1' then
  if state ~= 'closed' then
    -- Closed again: the window starts at one slot.
    ramp = 1
  elseif ramp then
    ramp = ramp + 1
  end
  if ramp and ramp < limit then
    redis.call('DEL', bkey)
    redis.call('HSET', bkey, 'state', 'closed', 'ramp', ramp)
    redis.call('PEXPIRE', bkey, 86400000)
  elseif b[1] or b[2] or b[3] or b[4] then
    -- A healthy destination has no record: nothing to delete.
    redis.call('DEL', bkey)
  end
  return { 'closed', '0', state ~= 'closed' and '1' or '0' }
end
if state == 'open' then
  return { 'open', int(untl), '0' }
end
local now = store_now_ms()
failures = failures + 1
if state == 'half_open' or failures >= tonumber(ARGV[5]) then
  untl = now + tonumber(ARGV[6])
  redis.call('HSET', bkey, 'state', 'open', 'until', int(untl), 'failures', failures)
  redis.call('HDEL', bkey, 'ramp')
  redis.call('PEXPIRE', bkey, 86400000)
  return { 'open', int(untl), '1' }
end
redis.call('HSET', bkey, 'state', 'closed', 'failures', failures)
if ramp then
  redis.call('HSET', bkey, 'ramp', math.max(1, math.floor(ramp / 2)))
end
redis.call('PEXPIRE', bkey, 86400000)
return { 'closed', '0', '0' }
