-- ARGV: P, job_id, channel
local P, id = ARGV[1], ARGV[2]
local removed = redis.call('DEL', P .. 'job:' .. id)
redis.call('ZREM', P .. 'pending', id)
redis.call('ZREM', P .. 'jobs', id)
if removed == 1 then
  redis.call('PUBLISH', ARGV[3], id)
end
return removed
