-- ARGV: P, N, schedule_id, attempt, node_id, max_concurrency, ttl_ms, confirm_ms
-- Returns {'ok', run} | {'full'} | {'not_waiting', run or ''}; a run is its record
-- (MessagePack, see runlib.lua).
local P, N, sid = ARGV[1], ARGV[2], ARGV[3]
local run = load_run(P, sid)
if not run then
  return { 'not_waiting', '' }
end
if run.state ~= 'WAITING' or run.attempt ~= tonumber(ARGV[4]) or run.deadlines.wake_at == 0 then
  return { 'not_waiting', encode_run(run) }
end
local leased, busy, count = lease_to(P, N, run, ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), store_now_ms())
if leased == 'full' then
  return { 'full' }
end
local record = save_run(P, run)
take_slot(busy, sid, count)
return { 'ok', record }
