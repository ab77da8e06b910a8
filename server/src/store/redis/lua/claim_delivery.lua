-- ARGV: P, schedule_id, lease_ms. Claims a due outbox entry: in flight under a new
-- delivery token until now + lease. Reply: {} when not due or gone, else {job_id,
-- url, body, attempts, created_at, token, now}.
local P, sid, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local key, f = read_delivery(P, sid, { 'token', 'due', 'job_id', 'url', 'body', 'attempts', 'created_at' })
if not f then
  redis.call('ZREM', P .. 'outbox_due', sid)
  return {}
end
local now = store_now_ms()
if tonumber(f[2]) > now then
  return {}
end
-- Tokens only grow: max(last + 1, store time in µs), as fencing tokens do.
local token = int(math.max(tonumber(f[1]) + 1, store_now_us()))
local due = int(now + lease)
redis.call('HSET', key, 'token', token, 'in_flight', '1', 'due', due)
redis.call('ZADD', P .. 'outbox_due', due, sid)
return { f[3], f[4], f[5], f[6], f[7], token, int(now) }
