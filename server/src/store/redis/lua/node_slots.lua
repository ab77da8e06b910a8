-- KEYS: the node's reservations, <prefix>:{held:<node>} (a slot of the node's own).
-- ARGV: op, then per op:
--   'reserve', max (0: no limit), hold_ms, schedule_ids…
--   'extend', hold_ms, schedule_ids…
--   'release', schedule_ids…
-- A cluster's count of the runs leased to one node (on one Redis the run scripts keep
-- it themselves in {nodes}:busy:<node>; a cluster refuses a script whose keys span the
-- run's partition and another slot). The key is a zset schedule_id -> end of the
-- reservation (store clock): a run is reserved here before the partition's script
-- leases it, the reservation follows the lease's renewals, and it is released once the
-- run leaves the node (or after a failed lease); one lost with a crashed instance
-- between two steps lapses at its end, so the count is never below the runs the node
-- holds, only above it for a while. Each node's key has a hash tag of its own, so the
-- nodes' counts spread over the masters.
-- 'reserve' answers per schedule_id 'ok', 'full', or 'taken' (reserved already: the
-- run is leased or being leased, and only the reservation's maker may release it);
-- 'extend' (only reservations that exist) and 'release' answer how many changed.
local key, op = KEYS[1], ARGV[1]
local now = store_now_ms()
if op == 'reserve' then
  local max, hold = tonumber(ARGV[2]), tonumber(ARGV[3])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local count = redis.call('ZCARD', key)
  local out = {}
  for i = 4, #ARGV do
    if redis.call('ZSCORE', key, ARGV[i]) then
      out[#out + 1] = 'taken'
    elseif max > 0 and count >= max then
      out[#out + 1] = 'full'
    else
      redis.call('ZADD', key, int(now + hold), ARGV[i])
      count = count + 1
      out[#out + 1] = 'ok'
    end
  end
  redis.call('PEXPIRE', key, 86400000)
  return out
elseif op == 'extend' then
  local until_ms = int(now + tonumber(ARGV[2]))
  local n = 0
  for i = 3, #ARGV do
    n = n + redis.call('ZADD', key, 'XX', 'GT', 'CH', until_ms, ARGV[i])
  end
  return n
elseif op == 'release' then
  local n = 0
  for i = 2, #ARGV do
    n = n + redis.call('ZREM', key, ARGV[i])
  end
  return n
end
return redis.error_reply('node_slots: unknown op ' .. tostring(op))
