-- ARGV: P, job_id, expected_version, record_json, paused(0|1), next_due|'', jitter_offset, channel
-- One atomic version bump that rewrites the pending member, so a claim computed from
-- the old definition can never re-arm it.
local P, id = ARGV[1], ARGV[2]
local job = P .. 'job:' .. id
local current = redis.call('HGET', job, 'version')
if not current then
  return {'notfound'}
end
if current ~= ARGV[3] then
  return {'conflict', current}
end
redis.call('HSET', job, 'rec', ARGV[4], 'version', int(tonumber(current) + 1), 'paused', ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', job, 'jit', ARGV[7])
  redis.call('ZADD', P .. 'pending', ARGV[6], id)
else
  redis.call('ZREM', P .. 'pending', id)
end
redis.call('PUBLISH', ARGV[8], id)
return {'ok', int(tonumber(current) + 1)}
