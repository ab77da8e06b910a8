-- ARGV: P, limit, instance, partition_lease_ms.
-- Returns {now, {member, due, member, due, ...}, next_due|false}; a member is
-- "<version>:<jitter offset>:<job_id>" (see apply_jobs.lua).
local P, limit = ARGV[1], tonumber(ARGV[2])
local now = store_now_ms()
local pending = P .. 'pending'
-- While another instance works this partition, report nothing due and when to look
-- again: it expires soon after that instance stops reading here.
if tonumber(ARGV[4]) > 0 then
  local lease = P .. 'claimer'
  local holder = redis.call('GET', lease)
  if holder and holder ~= ARGV[3] then
    local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
    if not first[2] then
      return {int(now), {}, false}
    end
    return {int(now), {}, int(math.max(tonumber(first[2]), now + math.max(redis.call('PTTL', lease), 1)))}
  end
  redis.call('SET', lease, ARGV[3], 'PX', ARGV[4])
end
-- Nothing due (an idle partition): one ZRANGE.
local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
if not first[2] then
  return {int(now), {}, false}
end
if tonumber(first[2]) > now then
  return {int(now), {}, first[2]}
end
local due = redis.call('ZRANGEBYSCORE', pending, '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
local n = #due / 2
local after = redis.call('ZRANGE', pending, n, n, 'WITHSCORES')
return {int(now), due, after[2] or false}
