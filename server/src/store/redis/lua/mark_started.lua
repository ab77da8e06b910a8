-- ARGV: P, N (unused), schedule_id, token
local P, sid, token = ARGV[1], ARGV[3], ARGV[4]
local run = load_held(P, sid)
if not run then
  return reply('no', 'unknown run')
end
if run.fencing_token ~= token then
  return reply('no', 'stale fencing token', cjson.encode(run))
end
if run.state == 'RUNNING' then
  return reply('already', '', cjson.encode(run))
end
if run.state ~= 'DISPATCHED' then
  return reply('no', 'run is ' .. run.state, cjson.encode(run))
end
run.state = 'RUNNING'
run.started_at = store_now_ms()
run.deadlines.confirm_by = 0
return reply('yes', '', save_run(P, run))
