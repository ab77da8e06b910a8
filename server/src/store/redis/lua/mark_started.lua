-- ARGV: P, N (unused), schedule_id, node, token
local P, sid, node, token = ARGV[1], ARGV[3], ARGV[4], ARGV[5]
local run, refused = reported_run(P, sid, node, token)
if not run then
  return reply('no', refused)
end
if refused then
  return reply('no', refused, encode_run(run))
end
if run.state == 'RUNNING' then
  return reply('already', '', encode_run(run))
end
if run.state ~= 'DISPATCHED' then
  return reply('no', 'run is ' .. run.state, encode_run(run))
end
run.state = 'RUNNING'
run.started_at = store_now_ms()
run.deadlines.confirm_by = 0
return reply('yes', '', save_run(P, run))
