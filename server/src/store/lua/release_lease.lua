-- ARGV: P, schedule_id, token
local P, sid = ARGV[1], ARGV[2]
local lease = P .. 'lease:' .. sid
if redis.call('HGET', lease, 'token') ~= ARGV[3] then
  return 0
end
redis.call('DEL', lease)
redis.call('ZREM', P .. 'leases', sid)
return 1
