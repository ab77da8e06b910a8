-- ARGV: P, N, schedule_id, 'holder' | 'waiting', token or attempt, outcome_json, and
-- for 'holder' the node
local P, N, sid, by, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local run
if by == 'holder' then
  run = load_held(P, sid)
else
  run = load_run(P, sid)
end
if not run then
  return reply('no', 'unknown run')
end
if by == 'holder' then
  local refused = holder_refusal(run, ARGV[7], value)
  if refused then
    return reply('no', refused, encode_run(run))
  end
  if FINAL[run.state] then
    return reply('already', '', encode_run(run))
  end
  if not HELD[run.state] then
    return reply('no', 'run is ' .. run.state, encode_run(run))
  end
elseif run.state ~= 'WAITING' or run.attempt ~= tonumber(value) then
  return reply('no', 'run is no longer waiting', encode_run(run))
elseif run.deadlines.wake_at == 0 then
  return reply('no', 'run is queued', encode_run(run))
end
local o = cjson.decode(ARGV[6])
local now = store_now_ms()
if o.state == 'WAITING' then
  -- The executor rejected the dispatch: route it elsewhere, same attempt.
  if by ~= 'holder' then
    return reply('no', 'only a lease holder can reject', encode_run(run))
  end
  leave_node(N, run)
  run.last_node = run.node_id
  run.fencing_token = new_token(P, run.job_id)
  run.state = 'WAITING'
  run.reason = 'rejected: ' .. (o.error_message or '')
  clear_deadlines(run)
  run.deadlines.wake_at = now
  run.deadlines.wait_until = now + (tonumber(run.plan.dispatch_wait_ms) or 0)
  return reply('yes', '', save_run(P, run))
end
leave_node(N, run)
if o.output ~= nil and o.output ~= cjson.null then
  run.output = o.output
end
run.error_code = o.error_code or ''
run.error_message = o.error_message or ''
if o.started_at ~= nil and o.started_at ~= cjson.null then
  run.started_at = o.started_at
end
-- Set before the run may become final, so the webhook body written then has it (a
-- retry clears it again).
if o.finished_at ~= nil and o.finished_at ~= cjson.null then
  run.finished_at = o.finished_at
end
local nxt
if o.state == 'FAILED' then
  local reason = run.error_code ~= '' and run.error_code or 'failed'
  nxt = retry_or_final(P, run, 'FAILED', reason, now, backoff_after(run.plan, run.attempt))
  if run.state == 'FAILED' then
    run.reason = ''
  end
else
  nxt = finalize(P, run, o.state, '', now, true)
end
return reply('yes', '', save_run(P, run), nil, nxt)
