-- ARGV: P, N, schedule_id, reason
local P, N, sid, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local run = load_run(P, sid)
if not run then
  return reply('no', 'unknown run')
end
if FINAL[run.state] then
  return reply('no', 'run is already ' .. run.state, encode_run(run))
end
local now = store_now_ms()
local rvs, nxt = cancel_tree(P, N, run, reason, now, true)
return reply('yes', '', save_run(P, run), rvs, nxt)
