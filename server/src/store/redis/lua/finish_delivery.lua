-- ARGV: P, schedule_id, token, kind (delivered | retry | failed | gone | abandon | defer),
-- status, error, at (retry: delay ms; defer: due time ms). Reply: {applied, reason}.
local P, sid, token, kind = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, err, at = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local key = P .. 'outbox:' .. sid
local j = redis.call('GET', key)
if not j then
  return { 'no', 'unknown delivery' }
end
local e = cjson.decode(j)
if e.token ~= token or not e.in_flight then
  return { 'no', 'stale delivery token' }
end
local now = store_now_ms()
if kind == 'defer' then
  e.in_flight = false
  e.due = math.max(now, at)
  redis.call('SET', key, cjson.encode(e))
  redis.call('ZADD', P .. 'outbox_due', int(e.due), sid)
  return { 'yes', '' }
end
if kind ~= 'abandon' then
  e.attempts = tonumber(e.attempts) + 1
end
local run = load_run(P, sid)
if run then
  run.callback_attempts = e.attempts
  run.callback_status = status
  run.callback_error = err
end
if kind == 'retry' then
  e.in_flight = false
  e.due = now + at
  redis.call('SET', key, cjson.encode(e))
  redis.call('ZADD', P .. 'outbox_due', int(e.due), sid)
else
  redis.call('DEL', key)
  redis.call('ZREM', P .. 'outbox_due', sid)
  if run then
    run.callback_state = kind == 'delivered' and 'DONE' or 'FAILED'
  end
end
if run then
  save_run(P, run)
end
return { 'yes', '' }
