-- ARGV: P, schedule_id, node, token, percent, message
-- Returns '' when stored, else the reason.
local P = ARGV[1]
local run, refused = held_run(P, ARGV[2], ARGV[3], ARGV[4])
if not run then
  return refused
end
run.progress_percent = tonumber(ARGV[5])
run.progress_message = ARGV[6]
save_run(P, run)
return ''
