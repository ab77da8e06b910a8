-- ARGV: P, N, job_id, schedule_id, run record (MessagePack), scheduled_at, retention_ms,
-- max_runs_per_job, route_grace_ms
-- Returns {created, run record, index hint, then 5 fields per revoked lease}, or
-- {'need', key...} (see `want`).
local out = begin(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9]), nil)
return out
