-- ARGV: P, schedule_id, token, kind (delivered | retry | failed | gone | abandon | defer),
-- status, error, at (retry: delay ms; defer: due time ms). Reply: {applied, reason}.
local P, sid, token, kind = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status, err, at = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local key, f = read_delivery(P, sid, { 'token', 'in_flight', 'attempts' })
if not f then
  return { 'no', 'unknown delivery' }
end
if f[1] ~= token or f[2] ~= '1' then
  return { 'no', 'stale delivery token' }
end
local now = store_now_ms()
if kind == 'defer' then
  local due = int(math.max(now, at))
  redis.call('HSET', key, 'in_flight', '0', 'due', due)
  redis.call('ZADD', P .. 'outbox_due', due, sid)
  return { 'yes', '' }
end
local attempts = tonumber(f[3]) or 0
if kind ~= 'abandon' then
  attempts = attempts + 1
end
local run = load_run(P, sid)
if run then
  run.callback_attempts = attempts
  run.callback_status = status
  run.callback_error = err
end
if kind == 'retry' then
  local due = int(now + at)
  redis.call('HSET', key, 'in_flight', '0', 'due', due, 'attempts', int(attempts))
  redis.call('ZADD', P .. 'outbox_due', due, sid)
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
