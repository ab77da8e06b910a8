-- ARGV: P, N, ttl_ms, confirm_ms (the lease terms, the same for all), then 9 fields per
-- run of partition P, of distinct jobs: job_id, schedule_id, run record (MessagePack),
-- scheduled_at, retention_ms, max_runs_per_job, route_grace_ms, node_id,
-- max_concurrency (begin_and_assign's, in its order).
-- KEYS: RedisStore::begin_keys of each run and its job's index hint; {'need', key...}
-- when a run's job names keys not among them (see `want`), before anything is written.
-- begin_and_assign of each run, in order, in one step (one call and one TIME for the
-- batch): begin_and_assign's reply per run.
local P, N = ARGV[1], ARGV[2]
local ttl, confirm = tonumber(ARGV[3]), tonumber(ARGV[4])
if not prefix_only then
  -- What each begin will look at, asked for at once (its jobs are distinct, so none
  -- of them changes what another's asks). On one Redis nothing is asked for.
  for i = 5, #ARGV, 9 do
    begin_needs(P, ARGV[i], decode_run(ARGV[i + 2]).plan.overlap, ARGV[i + 4], ARGV[i + 5])
  end
  if asked then
    return needed()
  end
end
local out = {}
for i = 5, #ARGV, 9 do
  local node, max = ARGV[i + 7], tonumber(ARGV[i + 8])
  local reply, leased = begin(P, N, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
    ARGV[i + 5], tonumber(ARGV[i + 6]),
    function(run, now)
      return lease_to(P, N, run, node, max, ttl, confirm, now)
    end)
  if leased == true then
    -- A begin asked for a key after the check above: two runs of one job in a batch.
    return redis.error_reply('begin_and_assign_many: a run asked for keys mid-batch (' ..
      ARGV[i + 1] .. '); runs of one job go in separate calls')
  end
  table.insert(reply, 3, leased or '')
  out[#out + 1] = reply
end
return out
