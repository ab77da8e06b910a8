-- Beginning runs with beginlib's own `begin`, in a loop (appended to common.lua,
-- runlib.lua and beginlib.lua by scripts/bench-lua.sh). ARGV: iterations, mode.
-- Modes: record (only building each run's record, as the server sends it: one map),
-- begin (begin_run of an allow job's run), assign (begin_and_assign to one of 10
-- nodes with a window), first (the same, each run its job's first: the begin creates the
-- job's index, writes its TTL and marks the job `plain`, as in a burst of new jobs). Runs
-- are spread over 100 jobs (first: one job each), each a new schedule_id, so the
-- keyspace grows as in a burst. Returns the ns per iteration.
prefix_only = true
local P, N = 'bench:{0}:', 'bench:{nodes}:'
local n, mode = tonumber(ARGV[1]), ARGV[2]
local plan = { backoff_ms = 100, dispatch_wait_ms = 5000, serial_limit = 10 }
local jobs = mode == 'first' and n or 100
for j = 1, jobs do
  redis.call('HSET', P .. 'job:j' .. j, 'version', '1', 'paused', '0')
end
local base = tonumber(redis.call('TIME')[1]) * 1000
local t0 = redis.call('TIME')
for i = 1, n do
  store_time_reply = nil
  new_call()
  local job = 'j' .. (i % jobs + 1)
  local sid = job .. '@' .. (base + i)
  local record = cmsgpack.pack({
    schedule_id = sid, job_id = job, schedule_no = tostring(base + i), state = 'TRIGGERED',
    kind = 'CRON', attempt = 1, fencing_token = '0', scheduled_at = base + i,
    triggered_at = base + i, created_at = base + i, job_version = 1, plan = plan, deadlines = {},
  })
  local lease = nil
  if mode == 'assign' or mode == 'first' then
    lease = function(run, now)
      return lease_to(P, N, run, 'node-' .. (i % 10), 1000000, 30000, 10000, now)
    end
  elseif mode ~= 'begin' and mode ~= 'record' then
    return redis.error_reply('unknown mode ' .. mode)
  end
  if mode ~= 'record' then
    begin(P, N, job, sid, record, base + i, 604800000, 10000, 30000, lease)
  end
end
local t1 = redis.call('TIME')
return math.floor(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) * 1000 / n)
