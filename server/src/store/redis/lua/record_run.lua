-- ARGV: P, job_id, schedule_id, run_json, scheduled_at, retention_ms, max_runs_per_job
-- Idempotent: a redelivered trigger finds the run it created and gets it back.
-- KEYS: the run's record, the job's hash and its index; {'need', key...} when the
-- index's oldest entries are to be looked at or dropped (see index_needs).
local P, id, sid = ARGV[1], ARGV[2], ARGV[3]
local runkey = P .. 'run:' .. sid
local existing = redis.call('GET', runkey)
if existing then
  return {0, existing}
end
local head = index_needs(P, id, ARGV[6], ARGV[7])
if asked then
  return needed()
end
local now = store_now_ms()
local run = decode_run(ARGV[4])
local job = redis.call('HMGET', P .. 'job:' .. id, 'version', 'paused')
if run.state ~= 'SKIPPED' then
  if not job[1] then
    run.state, run.reason, run.finished_at = 'SKIPPED', 'deleted', now
  elseif job[2] == '1' then
    run.state, run.reason, run.finished_at = 'SKIPPED', 'paused', now
  end
end
if run.created_at == 0 then
  run.created_at = now
end
if run.state == 'SKIPPED' and (run.finished_at == nil or run.finished_at == cjson.null) then
  run.finished_at = now
end
-- MessagePack, as the run scripts write records (see runlib.lua); nulls become nil.
note_change(run)
local json = encode_run(run)
redis.call('SET', runkey, json, 'PX', ARGV[6])
local index = P .. 'runs:' .. id
-- Retention: records expire by themselves (PX), about in index order; the index
-- forgets them lazily (drop_expired). Then the count bound.
local _, card = drop_expired(P, index, head, head.card + redis.call('ZADD', index, ARGV[5], sid),
  ARGV[5], ARGV[6])
local excess = card - tonumber(ARGV[7])
if excess > 0 then
  local old = redis.call('ZRANGE', index, 0, excess - 1)
  for _, o in ipairs(old) do
    redis.call('DEL', P .. 'run:' .. o)
    drop_done_delivery(P, o)
  end
  redis.call('ZREMRANGEBYRANK', index, 0, excess - 1)
end
redis.call('PEXPIRE', index, 2 * tonumber(ARGV[6]))
return {1, json}
