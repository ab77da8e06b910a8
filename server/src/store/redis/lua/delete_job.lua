-- ARGV: P, job_id, channel
local P, id = ARGV[1], ARGV[2]
local job = P .. 'job:' .. id
local member = redis.call('HGET', job, 'member')
if member then
  redis.call('ZREM', P .. 'pending', member)
end
local removed = redis.call('DEL', job)
redis.call('ZREM', P .. 'jobs', id)
if removed == 1 then
  redis.call('PUBLISH', ARGV[3], id)
end
return removed
