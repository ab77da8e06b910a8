-- ARGV: K (the instances zset), N (the {nodes} prefix), instance, then the ids of the
-- registered nodes (read by the caller: none registers to a dead instance).
-- Forgets an instance whose beat has run out and whose triggers were all taken over,
-- with the nodes still registered to it: their streams died with it, and a dispatch
-- routed to one would go to an inbox nobody reads. (An executor that reconnected to
-- another instance is registered there and stays.) An instance that beat again
-- meanwhile (it was only stalled) stays, with its nodes. Returns the nodes removed, or
-- -1 when the instance stays.
local K, N, dead = ARGV[1], ARGV[2], ARGV[3]
local at = redis.call('ZSCORE', K, dead)
if not at or tonumber(at) >= store_now_ms() then
  return -1
end
redis.call('ZREM', K, dead)
local removed = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local key = N .. 'node:' .. id
  if redis.call('HGET', key, 'inst') == dead then
    redis.call('DEL', key)
    redis.call('SREM', N .. 'ids', id)
    removed = removed + 1
  end
end
return removed
