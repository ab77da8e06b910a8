-- ARGV: P, job_id, expected_version, record_json, paused(0|1), next_due|'', jitter_offset, channel
-- One atomic version bump that replaces the pending member (whose name carries the
-- version), so a claim computed from the old definition can never re-arm it.
local P, id = ARGV[1], ARGV[2]
local job = P .. 'job:' .. id
local cur = redis.call('HMGET', job, 'version', 'member')
if not cur[1] then
  return {'notfound'}
end
if cur[1] ~= ARGV[3] then
  return {'conflict', cur[1]}
end
local version = int(tonumber(cur[1]) + 1)
if cur[2] then
  redis.call('ZREM', P .. 'pending', cur[2])
end
redis.call('HSET', job, 'rec', ARGV[4], 'version', version, 'paused', ARGV[5], 'jit', ARGV[7])
if ARGV[6] ~= '' then
  local member = version .. ':' .. ARGV[7] .. ':' .. id
  redis.call('HSET', job, 'member', member)
  redis.call('ZADD', P .. 'pending', ARGV[6], member)
else
  redis.call('HDEL', job, 'member')
end
redis.call('PUBLISH', ARGV[8], id)
return {'ok', version}
