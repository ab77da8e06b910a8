-- ARGV: P, N (unused), schedule_id, node, token
local applied, reason, _, record = start_run(ARGV[1], ARGV[3], ARGV[4], ARGV[5])
return reply(applied, reason, record)
