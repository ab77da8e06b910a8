-- ARGV: P, then (schedule_id, node, token) per executor's `Started` of partition P.
-- mark_started of each, in order, in one step: returns 2 fields per report, the answer
-- ('yes' | 'already' | 'no') and the reason of a 'no'.
local P = ARGV[1]
local out = {}
for i = 2, #ARGV, 3 do
  local applied, reason = start_run(P, ARGV[i], ARGV[i + 1], ARGV[i + 2])
  out[#out + 1] = applied
  out[#out + 1] = reason or ''
end
return out
