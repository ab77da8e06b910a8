-- ARGV: P, N (unused), schedule_id, node, token
local applied, reason, run, record = start_run(ARGV[1], ARGV[3], ARGV[4], ARGV[5])
if record then
  return reply(applied, reason, record)
end
return reply(applied, reason, run and encode_run(run))
