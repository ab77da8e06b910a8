-- ARGV: P, N, schedule_id, node, token
-- A silent node's dispatch that nothing confirmed goes back to WAITING at the same
-- attempt, as its confirm deadline passing would take it; a Started applied first
-- (RUNNING) or a heartbeat that listed it (confirm_by 0) keeps it where it is.
local P, N, sid, node, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local run, refused = reported_run(P, sid, node, token)
if not run then
  return reply('no', refused)
end
if refused then
  return reply('no', refused, encode_run(run))
end
if run.state ~= 'DISPATCHED' then
  return reply('no', 'run is ' .. run.state, encode_run(run))
end
if run.deadlines.confirm_by == 0 then
  return reply('no', 'the dispatch is confirmed', encode_run(run))
end
local rv = unconfirmed(P, N, run, store_now_ms())
return reply('yes', '', save_run(P, run), rv)
