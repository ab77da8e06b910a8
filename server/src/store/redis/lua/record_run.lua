-- ARGV: P, N, job_id, schedule_id, run record (MessagePack or JSON), scheduled_at,
-- retention_ms, max_runs_per_job
-- Idempotent: a redelivered trigger finds the run it created and gets it back.
-- KEYS: RedisStore::begin_keys of the run and its job's index hint; {'need', key...}
-- when the index's oldest entries are to be looked at or dropped (see index_needs).
-- The run is recorded as given (SKIPPED when its job is paused or gone) and indexed
-- as a begin indexes one (index_new_run: the count bound drops a run's record, logs,
-- timer, node slot and done webhook entry alike).
local P, N, id, sid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local existing = redis.call('GET', P .. 'run:' .. sid)
if existing then
  return {0, existing}
end
local head = index_needs(P, id, ARGV[7], ARGV[8])
if asked then
  return needed()
end
local now = store_now_ms()
local run = decode_run(ARGV[5])
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
local record = index_new_run(P, N, run, ARGV[6], ARGV[7], ARGV[8], head, true)
return {1, record}
