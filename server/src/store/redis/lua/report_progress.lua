-- ARGV: P, schedule_id, token, percent, message
local P, sid = ARGV[1], ARGV[2]
local run = load_held(P, sid)
if not run or run.fencing_token ~= ARGV[3] or not HELD[run.state] then
  return 0
end
run.progress_percent = tonumber(ARGV[4])
run.progress_message = ARGV[5]
save_run(P, run)
return 1
