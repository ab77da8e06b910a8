-- A sketch, not the product: a `Started` report's step if a run's hot fields were a
-- Redis hash (HMGET of what the checks read, HSET of what changes, the history event
-- RPUSHed to a list, the timer re-scored), to compare with `record start` (runlib's
-- start_run on the MessagePack record). Each iteration first writes the hash back
-- (HSET of 6 fields, about 1.5 µs). ARGV: iterations. Returns the ns per iteration.
local P = 'bench:{0}:'
local n = tonumber(ARGV[1])
local key, hkey = P .. 'runh:x', P .. 'hist:x'
local t0 = redis.call('TIME')
for i = 1, n do
  redis.call('HSET', key, 'state', 'DISPATCHED', 'node_id', 'node-7f3a2b1c',
    'fencing_token', '1765000000123456', 'attempt', '1', 'confirm_by', '1765000010000',
    'lease_expires', '1765000030000')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local f = redis.call('HMGET', key, 'state', 'node_id', 'fencing_token', 'last_node', 'parent',
    'shard_total', 'attempt', 'lease_expires', 'timeout_at', 'wake_at')
  if f[1] == 'DISPATCHED' and f[2] == 'node-7f3a2b1c' and f[3] == '1765000000123456' then
    redis.call('HSET', key, 'state', 'RUNNING', 'started_at', now, 'confirm_by', '0')
    redis.call('RPUSH', hkey, cmsgpack.pack({ now, 'RUNNING', tonumber(f[7]), f[2], '' }))
    redis.call('ZADD', P .. 'timers', tonumber(f[8]), 'x')
  end
  if i % 30 == 0 then
    redis.call('DEL', hkey)
  end
end
local t1 = redis.call('TIME')
return math.floor(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) * 1000 / n)
