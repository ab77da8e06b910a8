-- ARGV: P, N, job_id, schedule_id, run_json, scheduled_at, retention_ms,
-- max_runs_per_job, route_grace_ms
-- Returns {created, run_json, then 4 fields per revoked lease}.
local P, N, id, sid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local existing = redis.call('GET', P .. 'run:' .. sid)
if existing then
  return { '0', existing }
end
local now = store_now_ms()
local run = cjson.decode(ARGV[5])
clear_deadlines(run)
run.created_at = now
local job = redis.call('HMGET', P .. 'job:' .. id, 'version', 'paused')
if run.state ~= 'SKIPPED' then
  if not job[1] then
    run.state, run.reason = 'SKIPPED', 'deleted'
  elseif job[2] == '1' then
    run.state, run.reason = 'SKIPPED', 'paused'
  end
end
local out = { '1', '' }
if run.state ~= 'SKIPPED' then
  local akey = P .. 'active:' .. id
  local live = {}
  for _, a in ipairs(redis.call('SMEMBERS', akey)) do
    local r = load_run(P, a)
    if r and not FINAL[r.state] then
      live[#live + 1] = r
    else
      redis.call('SREM', akey, a)
    end
  end
  local policy = run.plan.overlap
  local wait_ms = tonumber(run.plan.dispatch_wait_ms) or 0
  if #live > 0 and policy == 'forbid' then
    run.state, run.reason = 'SKIPPED', 'overlap'
  elseif #live > 0 and policy == 'serial' then
    local qkey = P .. 'serial:' .. id
    if redis.call('LLEN', qkey) >= (tonumber(run.plan.serial_limit) or 0) then
      run.state, run.reason = 'SKIPPED', 'serial queue full'
    else
      run.state, run.reason = 'WAITING', 'queued'
      redis.call('RPUSH', qkey, sid)
      redis.call('PEXPIRE', qkey, ARGV[7])
    end
  else
    if #live > 0 and policy == 'replace' then
      for _, r in ipairs(live) do
        local rvs = cancel_tree(P, N, r, 'replaced', now, false)
        save_run(P, r)
        for _, rv in ipairs(rvs) do
          for _, f in ipairs(rv) do
            out[#out + 1] = f
          end
        end
      end
    end
    run.state, run.reason = 'WAITING', ''
    run.deadlines.wake_at = now + tonumber(ARGV[9])
    run.deadlines.wait_until = now + wait_ms
  end
  if run.state == 'WAITING' then
    redis.call('SADD', akey, sid)
    redis.call('PEXPIRE', akey, ARGV[7])
  end
end
if run.state == 'SKIPPED' then
  run.finished_at = now
end
out[2] = index_new_run(P, N, run, ARGV[6], ARGV[7], ARGV[8])
if run.state == 'WAITING' and run.deadlines.wake_at > 0 then
  redis.call('ZADD', P .. 'timers', int(run.deadlines.wake_at), sid)
end
return out
