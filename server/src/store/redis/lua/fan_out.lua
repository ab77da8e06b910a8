-- ARGV: P, N (unused), schedule_id, attempt, shards, route_grace_ms, retention_ms.
-- Returns {applied, reason, parent record, then one record per shard}.
local P, sid, attempt, n = ARGV[1], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local run = load_run(P, sid)
if not run then
  return { 'no', 'unknown run', '' }
end
if run.state ~= 'WAITING' or run.attempt ~= attempt or run.deadlines.wake_at == 0 then
  return { 'no', 'run is no longer waiting', encode_run(run) }
end
local now = store_now_ms()
local wait_ms = tonumber(run.plan.dispatch_wait_ms) or 0
local template = encode_run(run)
local shards = {}
for i = 0, n - 1 do
  local s = decode_run(template)
  s.schedule_id = sid .. '#' .. i
  s.parent, s.shard_index, s.shard_total = sid, i, n
  s.shards_done, s.shards_succeeded = 0, 0
  s.attempt, s.state, s.reason, s.node_id, s.last_node = 1, 'WAITING', '', '', ''
  s.started_at, s.finished_at = cjson.null, cjson.null
  clear_history(s)
  s.created_at = now
  s.fencing_token = new_token(P)
  clear_deadlines(s)
  s.deadlines.wake_at = now + tonumber(ARGV[6])
  s.deadlines.wait_until = now + wait_ms
  redis.call('SET', P .. 'run:' .. s.schedule_id, '{}', 'PX', ARGV[7])
  shards[#shards + 1] = save_run(P, s)
end
run.state, run.reason, run.node_id = 'RUNNING', '', ''
run.shard_total, run.shards_done, run.shards_succeeded = n, 0, 0
run.started_at = now
clear_deadlines(run)
local out = { 'yes', '', save_run(P, run) }
for _, j in ipairs(shards) do
  out[#out + 1] = j
end
return out
