-- ARGV: N (the {nodes} prefix), op, then per op:
--   'reserve', node, max (0: no limit), hold_ms, schedule_ids…
--   'extend', node, hold_ms, schedule_ids…
--   'release', (node, schedule_id) pairs…
-- A cluster's count of the runs leased to each node (on one Redis the run scripts keep
-- it themselves in busy:<node>; a cluster refuses a script whose keys span the run's
-- partition and the {nodes} slot). held:<node> is a zset schedule_id -> end of the
-- reservation (store clock): a run is reserved here before the partition's script
-- leases it, the reservation follows the lease's renewals, and it is released once
-- the run leaves the node (or after a failed lease); one lost with a crashed instance
-- between two steps lapses at its end, so the count is never below the runs a node
-- holds, only above it for a while.
-- 'reserve' answers per schedule_id 'ok', 'full', or 'taken' (reserved already: the
-- run is leased or being leased, and only the reservation's maker may release it);
-- 'extend' changes only reservations that exist. 'extend' and 'release' answer how
-- many entries they changed.
local N, op = ARGV[1], ARGV[2]
local now = store_now_ms()
if op == 'reserve' then
  local key = N .. 'held:' .. ARGV[3]
  local max, hold = tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local count = redis.call('ZCARD', key)
  local out = {}
  for i = 6, #ARGV do
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
  local key = N .. 'held:' .. ARGV[3]
  local until_ms = int(now + tonumber(ARGV[4]))
  local n = 0
  for i = 5, #ARGV do
    n = n + redis.call('ZADD', key, 'XX', 'GT', 'CH', until_ms, ARGV[i])
  end
  return n
elseif op == 'release' then
  local n = 0
  for i = 3, #ARGV, 2 do
    n = n + redis.call('ZREM', N .. 'held:' .. ARGV[i], ARGV[i + 1])
  end
  return n
end
return redis.error_reply('node_slots: unknown op ' .. tostring(op))
