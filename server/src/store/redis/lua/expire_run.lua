-- ARGV: P, N, schedule_id, route_grace_ms. Acts on whatever deadline has passed.
-- KEYS: RedisStore::run_keys of the run; {'need', key...} when its job's serial queue
-- names runs not among them (see `want`), before anything is written.
local P, N, sid = ARGV[1], ARGV[2], ARGV[3]
end_needs(P, job_of(sid))
if asked then
  return needed()
end
local run = load_run(P, sid)
if not run then
  redis.call('ZREM', P .. 'timers', sid)
  return reply('no', 'unknown run')
end
if FINAL[run.state] then
  redis.call('ZREM', P .. 'timers', sid)
  return reply('no', 'run is final', encode_run(run))
end
local now = store_now_ms()
local d = run.deadlines
if HELD[run.state] then
  local confirmed = run.state == 'RUNNING' or d.confirm_by == 0
  if d.timeout_at > 0 and d.timeout_at <= now then
    local rv = revoke(P, N, run, 'timeout')
    run.error_code, run.error_message = 'timeout', 'the attempt exceeded its timeout'
    local nxt = retry_or_final(P, run, 'TIMED_OUT', 'timeout', now, backoff_after(run.plan, run.attempt))
    return reply('yes', '', save_run(P, run), rv, nxt)
  end
  if (not confirmed) and ((d.confirm_by > 0 and d.confirm_by <= now) or d.lease_expires <= now) then
    local rv = unconfirmed(P, N, run, now)
    return reply('yes', '', save_run(P, run), rv)
  end
  if d.lease_expires > 0 and d.lease_expires <= now then
    local rv = revoke(P, N, run, 'lost')
    run.error_code, run.error_message = 'lost', 'the executor stopped renewing its lease'
    local nxt = retry_or_final(P, run, 'FAILED', 'lost', now, 0)
    if run.state == 'FAILED' then
      run.reason = 'lost'
    end
    return reply('yes', '', save_run(P, run), rv, nxt)
  end
elseif run.state == 'WAITING' and d.wake_at > 0 and d.wake_at <= now then
  d.wake_at = now + tonumber(ARGV[4])
  return reply('yes', '', save_run(P, run))
end
-- Nothing due (the timer was early, e.g. after a renewal): re-score it.
return reply('no', 'nothing due', save_run(P, run))
