-- ARGV: P, N, schedule_id, reason
-- KEYS: RedisStore::run_keys of the run; {'need', key...} when its job's serial queue
-- or its shards name runs not among them (see `want`), before anything is written.
local P, N, sid, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local run = load_run(P, sid)
if not run then
  return reply('no', 'unknown run')
end
if FINAL[run.state] then
  return reply('no', 'run is already ' .. run.state, encode_run(run))
end
end_needs(P, run.job_id)
if (run.parent == nil or run.parent == '') then
  for i = 0, (tonumber(run.shard_total) or 0) - 1 do
    want(P .. 'run:' .. sid .. '#' .. i)
  end
end
if asked then
  return needed()
end
local now = store_now_ms()
local rvs, nxt = cancel_tree(P, N, run, reason, now, true)
return reply('yes', '', save_run(P, run), rvs, nxt)
