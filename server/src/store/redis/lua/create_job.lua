-- ARGV: P, job_id, record_json, paused(0|1), next_due|'', jitter_offset, channel
-- The pending member is "<version>:<jitter offset>:<job_id>", so a due-fires read needs
-- no per-job lookup and a claim's compare-and-set on the member's score checks the
-- version too. The hash remembers the member so a change can remove it.
local P, id = ARGV[1], ARGV[2]
local job = P .. 'job:' .. id
if redis.call('EXISTS', job) == 1 then
  return 'exists'
end
redis.call('HSET', job, 'rec', ARGV[3], 'version', '1', 'paused', ARGV[4], 'jit', ARGV[6])
if ARGV[5] ~= '' then
  local member = '1:' .. ARGV[6] .. ':' .. id
  redis.call('HSET', job, 'member', member)
  redis.call('ZADD', P .. 'pending', ARGV[5], member)
end
redis.call('ZADD', P .. 'jobs', 0, id)
redis.call('PUBLISH', ARGV[7], id)
return 'ok'
