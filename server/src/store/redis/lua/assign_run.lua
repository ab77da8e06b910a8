-- ARGV: P, N, schedule_id, attempt, node_id, max_concurrency, ttl_ms, confirm_ms
-- Returns {'ok', run_json} | {'full'} | {'not_waiting', run_json or ''}.
local P, N, sid, node = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local run = load_run(P, sid)
if not run then
  return { 'not_waiting', '' }
end
if run.state ~= 'WAITING' or run.attempt ~= tonumber(ARGV[4]) or run.deadlines.wake_at == 0 then
  return { 'not_waiting', cjson.encode(run) }
end
local busy = N .. 'busy:' .. node
local max = tonumber(ARGV[6])
if max > 0 and redis.call('SCARD', busy) >= max then
  return { 'full' }
end
local now = store_now_ms()
run.fencing_token = new_token(P, run.job_id)
run.node_id = node
run.state = 'DISPATCHED'
run.reason = ''
clear_deadlines(run)
run.deadlines.lease_expires = now + tonumber(ARGV[7])
run.deadlines.confirm_by = now + tonumber(ARGV[8])
local timeout = tonumber(run.plan.timeout_ms) or 0
if timeout > 0 then
  run.deadlines.timeout_at = now + timeout
end
redis.call('SADD', busy, sid)
redis.call('PEXPIRE', busy, 86400000)
return { 'ok', save_run(P, run) }
