-- ARGV: P, N, job_id, schedule_id, run record (MessagePack), scheduled_at, retention_ms,
-- max_runs_per_job, route_grace_ms (begin_run's), node_id, max_concurrency, ttl_ms,
-- confirm_ms (assign_run's).
-- begin_run, and when it creates the run WAITING to be routed now, assign_run of it to
-- the node, in one step: the run is written once, leased or not.
-- Returns {created, run record, leased ('ok' | 'full' | '' when not tried), index hint,
-- then 5 fields per revoked lease}, or {'need', key...} (see `want`).
local P, N = ARGV[1], ARGV[2]
local node, max, ttl, confirm = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local out, leased = begin(P, N, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9]),
  function(run, now)
    return lease_to(P, N, run, node, max, ttl, confirm, now)
  end)
if leased == true then
  return out
end
table.insert(out, 3, leased or '')
return out
