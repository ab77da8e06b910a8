-- ARGV: P, job_id, record_json, paused(0|1), next_due|'', jitter_offset, channel
local P, id = ARGV[1], ARGV[2]
local job = P .. 'job:' .. id
if redis.call('EXISTS', job) == 1 then
  return 'exists'
end
redis.call('HSET', job, 'rec', ARGV[3], 'version', '1', 'paused', ARGV[4])
if ARGV[5] ~= '' then
  -- The planned time is the pending score minus the job's stable jitter offset.
  redis.call('HSET', job, 'jit', ARGV[6])
  redis.call('ZADD', P .. 'pending', ARGV[5], id)
end
redis.call('ZADD', P .. 'jobs', 0, id)
redis.call('PUBLISH', ARGV[7], id)
return 'ok'
