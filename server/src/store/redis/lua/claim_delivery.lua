-- ARGV: P, schedule_id, lease_ms. Claims a due outbox entry: in flight under a new
-- delivery token until now + lease. Reply: {} when not due or gone, else {job_id,
-- url, body, attempts, created_at, token, now}.
local P, sid, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local key = P .. 'outbox:' .. sid
local j = redis.call('GET', key)
if not j then
  redis.call('ZREM', P .. 'outbox_due', sid)
  return {}
end
local e = cjson.decode(j)
local now = store_now_ms()
if tonumber(e.due) > now then
  return {}
end
-- Tokens only grow: max(last + 1, store time in µs), as fencing tokens do.
local token = math.max(tonumber(e.token) + 1, store_now_us())
e.token = int(token)
e.in_flight = true
e.due = now + lease
redis.call('SET', key, cjson.encode(e))
redis.call('ZADD', P .. 'outbox_due', int(e.due), sid)
return { e.job_id, e.url, e.body, int(e.attempts), int(e.created_at), e.token, int(now) }
