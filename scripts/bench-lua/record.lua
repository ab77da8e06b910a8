-- One run record's load and save, with runlib's own helpers, in a loop (appended to
-- common.lua and runlib.lua by scripts/bench-lua.sh). ARGV: iterations, mode, events.
-- Modes: get (the loop's reset SET and a GET alone), load (+ decode), save (load and
-- save_run), plan (load, read the plan, save: what finish and expire do), start
-- (start_run: a `Started` report's step), finish (finish: a `Result` that succeeded,
-- its webhook's outbox entry written). Each iteration first writes the record back
-- as the first save left it (a DISPATCHED run with `events` history events). Returns
-- the record's bytes and the ns per iteration.
prefix_only = true
local P, N = 'bench:{0}:', 'bench:{nodes}:'
-- A `Result`'s outcome as the server sends it (finish mode).
local outcome = cjson.encode({ state = 'SUCCEEDED', output = 'b2s=', started_at = 1765000000100,
  finished_at = 1765000000200 })
local n, mode, events = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local run = {
  schedule_id = 'x', job_id = 'job-000123', schedule_no = '1765000000000', state = 'DISPATCHED',
  kind = 'CRON', attempt = 1, fencing_token = '1765000000123456', node_id = 'node-7f3a2b1c',
  scheduled_at = 1765000000000, triggered_at = 1765000000001, created_at = 1765000000002,
  job_version = 1,
  plan = { max_attempts = 3, backoff_ms = 100, dispatch_wait_ms = 5000, serial_limit = 10,
    callback_url = 'http://127.0.0.1:9000/hook' },
  deadlines = { lease_expires = 1765000030000, confirm_by = 1765000010000 },
  history = {},
}
for i = 1, events do
  run.history[i] = { 1765000000002 + i, i % 2 == 1 and 'WAITING' or 'DISPATCHED', 1, 'node-7f3a2b1c', '' }
end
redis.call('SET', P .. 'run:x', cmsgpack.pack(run))
save_run(P, load_run(P, 'x'))
local stored = redis.call('GET', P .. 'run:x')
local t0 = redis.call('TIME')
for _ = 1, n do
  store_time_reply = nil
  new_call()
  redis.call('SET', P .. 'run:x', stored)
  if mode == 'get' then
    redis.call('GET', P .. 'run:x')
  elseif mode == 'load' then
    load_run(P, 'x')
  elseif mode == 'save' then
    save_run(P, load_run(P, 'x'))
  elseif mode == 'plan' then
    local r = load_run(P, 'x')
    local _ = r.plan.max_attempts
    save_run(P, r)
  elseif mode == 'start' then
    start_run(P, 'x', 'node-7f3a2b1c', '1765000000123456')
  elseif mode == 'finish' then
    finish(P, N, 'x', 'holder', '1765000000123456', outcome, 'node-7f3a2b1c', '')
  else
    return redis.error_reply('unknown mode ' .. mode)
  end
end
local t1 = redis.call('TIME')
return { #stored, math.floor(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) * 1000 / n) }
